/* Symbolization of recorded C stacks at snapshot time. With libdw (elfutils, -Dlibdw): the process's own
 * modules through dwfl, so names come from the full symbol table (static functions too) and files and
 * lines from DWARF where debug info exists (in the object or a separate debug file). Without it, or where
 * dwfl finds no module: dladdr, which knows exported (dynamic) symbols and object files only, line 0.
 * C++ names are demangled with the C++ runtime's __cxa_demangle, found in the process, or else in the
 * system's libstdc++.so.6, loaded once for that; with neither, names stay mangled. */
#include "symbolize.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef CACHALOT_HAVE_LIBDW
#include <elfutils/libdwfl.h>
#endif

#ifndef HASH_NONFATAL_OOM
#define HASH_NONFATAL_OOM 1
#endif
#define uthash_nonfatal_oom(obj) (hash_oom = true)
#include <uthash.h>

typedef struct {
  void *addr;
  char *name, *filename;
  int line;
  UT_hash_handle hh;
} cached_frame;

struct cl_symbolizer {
  cached_frame *cache;
#ifdef CACHALOT_HAVE_LIBDW
  Dwfl *dwfl;
  bool dwfl_tried;
#endif
};

typedef char *demangle_fn(const char *mangled, char *buf, size_t *len, int *status);
static demangle_fn *demangler;
static pthread_once_t demangler_once = PTHREAD_ONCE_INIT;

static void find_demangler(void) {
  void *f = dlsym(RTLD_DEFAULT, "__cxa_demangle");
  if (!f) { /* a plain C program: the system's C++ runtime has one (kept loaded: it is looked up once) */
    void *h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
    if (h)
      f = dlsym(h, "__cxa_demangle");
  }
  /* ISO C has no cast from object to function pointer; POSIX guarantees dlsym's result converts */
  memcpy(&demangler, &f, sizeof f);
}

char *cl_demangle(const char *name) {
  if (!name || strncmp(name, "_Z", 2) != 0)
    return NULL;
  pthread_once(&demangler_once, find_demangler);
  if (!demangler)
    return NULL;
  int status = -1;
  char *out = demangler(name, NULL, NULL, &status);
  if (status != 0) {
    free(out);
    return NULL;
  }
  return out;
}

bool cl_symbolize_has_libdw(void) {
#ifdef CACHALOT_HAVE_LIBDW
  return true;
#else
  return false;
#endif
}

cl_symbolizer *cl_symbolizer_new(void) { return calloc(1, sizeof(cl_symbolizer)); }

void cl_symbolizer_free(cl_symbolizer *s) {
  if (!s)
    return;
  cached_frame *f, *tmp;
  HASH_ITER(hh, s->cache, f, tmp) {
    HASH_DEL(s->cache, f);
    free(f->name);
    free(f->filename);
    free(f);
  }
#ifdef CACHALOT_HAVE_LIBDW
  if (s->dwfl)
    dwfl_end(s->dwfl);
#endif
  free(s);
}

/* name without its symbol version ("__libc_start_main@@GLIBC_2.34"), demangled when it is a C++ name. */
static char *name_copy(const char *name) {
  char *plain = strndup(name, strcspn(name, "@"));
  if (!plain)
    return NULL;
  char *d = cl_demangle(plain);
  if (!d)
    return plain;
  free(plain);
  return d;
}

/* dladdr: exported symbols and the object file. */
static void lookup_dladdr(void *addr, cached_frame *f) {
  Dl_info info;
  memset(&info, 0, sizeof info);
  const bool ok = dladdr(addr, &info) != 0;
  if (ok && info.dli_sname)
    f->name = name_copy(info.dli_sname);
  if (ok && info.dli_fname && info.dli_fname[0])
    f->filename = strdup(info.dli_fname);
}

#ifdef CACHALOT_HAVE_LIBDW
static Dwfl *process_dwfl(cl_symbolizer *s) {
  static const Dwfl_Callbacks callbacks = {
      .find_elf = dwfl_linux_proc_find_elf,
      .find_debuginfo = dwfl_standard_find_debuginfo,
  };
  if (s->dwfl_tried)
    return s->dwfl;
  s->dwfl_tried = true;
  Dwfl *dwfl = dwfl_begin(&callbacks);
  if (!dwfl)
    return NULL;
  /* the modules mapped now: a snapshot is taken after the stacks it names were recorded */
  if (dwfl_linux_proc_report(dwfl, getpid()) != 0 || dwfl_report_end(dwfl, NULL, NULL) != 0) {
    dwfl_end(dwfl);
    return NULL;
  }
  s->dwfl = dwfl;
  return dwfl;
}

/* The source file and line of pc from the compile unit whose ranges cover it. dwfl_module_getsrc finds
 * units through .debug_aranges, which clang does not emit. */
static const char *cu_line(Dwfl_Module *m, uintptr_t pc, int *line) {
  Dwarf_Addr bias = 0;
  for (Dwarf_Die *cu = dwfl_module_nextcu(m, NULL, &bias); cu; cu = dwfl_module_nextcu(m, cu, &bias)) {
    if (dwarf_haspc(cu, (Dwarf_Addr)pc - bias) != 1)
      continue;
    Dwarf_Line *l = dwarf_getsrc_die(cu, (Dwarf_Addr)pc - bias);
    if (!l || dwarf_lineno(l, line) != 0)
      return NULL;
    return dwarf_linesrc(l, NULL, NULL);
  }
  return NULL;
}

/* dwfl: the full symbol table and DWARF lines. pc is inside the call instruction. */
static void lookup_dwfl(cl_symbolizer *s, uintptr_t pc, cached_frame *f) {
  Dwfl *dwfl = process_dwfl(s);
  Dwfl_Module *m = dwfl ? dwfl_addrmodule(dwfl, (Dwarf_Addr)pc) : NULL;
  if (!m)
    return;
  GElf_Off off;
  GElf_Sym sym;
  const char *name = dwfl_module_addrinfo(m, (GElf_Addr)pc, &off, &sym, NULL, NULL, NULL);
  if (name && name[0])
    f->name = name_copy(name);
  Dwfl_Line *l = dwfl_module_getsrc(m, (Dwarf_Addr)pc);
  int line = 0;
  const char *file = l ? dwfl_lineinfo(l, NULL, &line, NULL, NULL, NULL) : cu_line(m, pc, &line);
  if (file && file[0]) {
    f->filename = strdup(file);
    f->line = line;
    return;
  }
  const char *mainfile = NULL;
  dwfl_module_info(m, NULL, NULL, NULL, NULL, NULL, &mainfile, NULL);
  if (mainfile && mainfile[0])
    f->filename = strdup(mainfile);
}
#endif

static const cl_frame_info unknown = {"??", "??", 0};

cl_frame_info cl_symbolize(cl_symbolizer *s, void *addr) {
  if (!s)
    return unknown;
  cached_frame *f;
  HASH_FIND_PTR(s->cache, &addr, f);
  if (!f) {
    f = calloc(1, sizeof *f);
    if (!f)
      return unknown;
    f->addr = addr;
    /* a return address follows the call: the byte before it is in the call, and so on the call's line */
    const uintptr_t pc = (uintptr_t)addr - ((uintptr_t)addr > 0);
#ifdef CACHALOT_HAVE_LIBDW
    lookup_dwfl(s, pc, f);
#endif
    if (!f->name && !f->filename)
      lookup_dladdr((void *)pc, f);
    if (!f->name) {
      char hex[32];
      snprintf(hex, sizeof hex, "0x%llx", (unsigned long long)(uintptr_t)addr);
      f->name = strdup(hex);
    }
    bool hash_oom = false;
    HASH_ADD_PTR(s->cache, addr, f);
    if (hash_oom || !f->name) {
      if (!hash_oom)
        HASH_DEL(s->cache, f);
      free(f->name);
      free(f->filename);
      free(f);
      return unknown;
    }
  }
  return (cl_frame_info){f->name, f->filename ? f->filename : "??", f->line};
}
