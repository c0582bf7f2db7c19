#!/usr/bin/env python3
"""The explorer suite: alloc_snapshot plot's pages driven in headless Chromium.

usage: run.py ALLOC_SNAPSHOT TESTS_EXPLORER_DIR CLI_FIXTURES_DIR WORK_DIR

Plots fixtures, puts an error catcher at the top of each page (window.onerror, unhandledrejection) and
driver.js at its end, loads it with `chromium --headless --dump-dom` and reads the PASS / FAIL lines the
driver wrote. Exit 0 when every page ran with no FAIL, 1 otherwise, 77 (skipped) without chromium.
"""
import os
import shutil
import subprocess
import sys

CATCHER = ("<script>window.__errors=[];window.onerror=function(m,s,l,c){window.__errors.push(m+' at '+l+':'+c)};"
           "window.addEventListener('unhandledrejection',function(e){window.__errors.push('rejection '+e.reason)});"
           "window.__mode=%r;window.__devices=%d;</script>")


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def run_page(browser, tool, fixture, work, name, mode, devices=1, hash_=""):
    page = os.path.join(work, name + ".html")
    r = subprocess.run([tool, "plot", fixture, "-o", page], capture_output=True, text=True)
    if r.returncode != 0:
        return ["FAIL %s: alloc_snapshot plot exited %d: %s" % (name, r.returncode, r.stderr.strip())]
    with open(page, encoding="utf-8") as f:
        html = f.read()
    with open(os.path.join(os.path.dirname(__file__), "driver.js"), encoding="utf-8") as f:
        driver = f.read()
    if "<body>" not in html or "</body>" not in html:
        return ["FAIL %s: the page has no <body> ... </body>" % name]
    html = html.replace("<body>", "<body>" + CATCHER % (mode, devices), 1)
    html = html.replace("</body>", "<script>\n" + driver + "\n</script>\n</body>", 1)
    test_page = os.path.join(work, name + ".test.html")
    with open(test_page, "w", encoding="utf-8") as f:
        f.write(html)
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--window-size=1400,1000",
           "--user-data-dir=" + os.path.join(work, "profile"), "--virtual-time-budget=20000", "--dump-dom",
           "file://" + os.path.abspath(test_page) + hash_]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return ["FAIL %s: chromium did not finish in 120 s" % name]
    dom = r.stdout.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
    if "BEGIN\n" not in dom or "\nEND\n" not in dom:
        return ["FAIL %s: the driver wrote no results (chromium exit %d): %s" % (name, r.returncode, r.stderr[-400:])]
    lines = dom.split("BEGIN\n", 1)[1].split("\nEND\n", 1)[0].splitlines()
    return ["%s [%s]" % (line, name) for line in lines]


def main():
    tool, here, fixtures, work = sys.argv[1:5]
    browser = chromium()
    if browser is None:
        print("skip: no chromium (apt-get install chromium)")
        return 77
    os.makedirs(work, exist_ok=True)
    fx = os.path.join(here, "explorer.json")
    results = run_page(browser, tool, fx, work, "explorer", "full")
    results += run_page(browser, tool, fx, work, "explorer_hash", "hash", hash_="#t=3&sel=3&x0=2&x1=10")
    # a block pending free at the snapshot whose free the trace does not hold: pending after every entry
    results += run_page(browser, tool, os.path.join(here, "pending.json"), work, "pending", "pending", hash_="#t=0")
    results += run_page(browser, tool, os.path.join(fixtures, "cachalot_small.json"), work, "two_devices", "smoke", 2)
    results += run_page(browser, tool, os.path.join(fixtures, "trace_small.json"), work, "trace_only", "smoke")
    results += run_page(browser, tool, os.path.join(fixtures, "segments_empty_trace.json"), work, "no_trace", "smoke", 2)
    results += run_page(browser, tool, os.path.join(fixtures, "no_trace.json"), work, "nothing", "empty", 0)
    for line in results:
        print(line)
    passed = sum(line.startswith("PASS ") for line in results)
    failed = len(results) - passed
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
