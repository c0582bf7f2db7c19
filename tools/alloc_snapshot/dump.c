/* alloc_snapshot dump: the snapshot (or stats) of a live process that runs with
 * CACHALOT_SNAPSHOT_SOCKET=PATH, asked for over that UNIX socket. The whole reply is checked to be one
 * JSON object (strict JSON, as the reader reads files: a NUL or anything after the object is refused)
 * before it is written, so a file never holds half an answer. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "cli.h"
#include "../common/snapshot_reader.h"

static const char help[] =
    "usage: alloc_snapshot dump --socket PATH [-o FILE] [--allocator N] [--stats DEVICE | --record N[,stacks]\n"
    "                           | --record off] [--timeout S]\n"
    "\n"
    "Asks a live process for its snapshot JSON, over the UNIX socket it serves when started with\n"
    "CACHALOT_SNAPSHOT_SOCKET=PATH (only the same user may connect).\n"
    "\n"
    "  --socket PATH    the process's socket\n"
    "  -o FILE          write there ('-' or none: standard output; FILE.gz is gzip'ed)\n"
    "  --allocator N    which of the process's allocators (0: the oldest live one; default 0)\n"
    "  --stats DEVICE   the memory_stats JSON of DEVICE instead of the snapshot\n"
    "  --record N[,stacks]  turn the allocator's memory history on, N entries per device (1 to 100000000),\n"
    "                   cleared, with C call stacks in the second form; prints the reply, e.g.\n"
    "                   {\"record\":N,\"stacks\":true}\n"
    "  --record off     turn its memory history (and stacks) off\n"
    "  --timeout S      give up when the process sends nothing for S seconds (default 30)\n"
    "\n"
    "Exit status: 0 success, 1 no answer (no such socket, refused, not JSON, an error reply), 2 usage error.\n";

enum { MAX_REPLY = 1 << 30, REPLY_TIMEOUT_S = 30 };
static int reply_timeout_s = REPLY_TIMEOUT_S;

/* Sends `req` and reads the whole reply, `*len` bytes, into a malloc'ed buffer. NULL after a message. */
static char *ask(const char *path, const char *req, size_t *len_out, int *status) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path) {
    *status = as_usage_error("dump", "socket path too long: %s", path);
    return NULL;
  }
  memcpy(addr.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    *status = as_failure("dump", "%s: cannot connect: %s%s", path, strerror(errno),
                         errno == ENOENT || errno == ECONNREFUSED
                             ? " (is the process running with CACHALOT_SNAPSHOT_SOCKET set to this path?)"
                             : "");
    if (fd >= 0)
      close(fd);
    return NULL;
  }
  /* A process that never answers (stopped, or its server stuck) must not hang the command: each read and
   * write gives up after REPLY_TIMEOUT_S seconds without progress. */
  const struct timeval tv = {reply_timeout_s, 0};
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  size_t len = strlen(req), off = 0;
  while (off < len) {
    ssize_t w = send(fd, req + off, len - off, MSG_NOSIGNAL); /* a peer that hangs up is an error, not a kill */
    if (w <= 0) {
      close(fd);
      *status = as_failure("dump", "%s: cannot send the request: %s", path, strerror(errno));
      return NULL;
    }
    off += (size_t)w;
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) {
      close(fd);
      *status = as_failure("dump", "out of memory");
      return NULL;
    }
    if (n + 1 == cap) {
      if (cap >= MAX_REPLY) {
        free(buf);
        close(fd);
        *status = as_failure("dump", "%s: the reply is larger than 1 GiB", path);
        return NULL;
      }
      char *b = realloc(buf, cap * 2);
      if (!b)
        free(buf);
      buf = b;
      cap *= 2;
      continue;
    }
    ssize_t r = read(fd, buf + n, cap - 1 - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      /* A connection reset mid-answer is no end of the answer: what came before it may parse. */
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        *status = as_failure("dump", "%s: no reply for %d s: gave up (is the process stopped?)", path,
                             reply_timeout_s);
      else
        *status = as_failure("dump", "%s: cannot read the reply: %s", path, strerror(errno));
      free(buf);
      close(fd);
      return NULL;
    }
    if (r == 0)
      break;
    n += (size_t)r;
  }
  close(fd);
  buf[n] = '\0';
  *len_out = n;
  return buf;
}

int as_cmd_dump(int argc, char **argv) {
  static const struct option longopts[] = {{"socket", required_argument, NULL, 's'},
                                            {"allocator", required_argument, NULL, 'a'},
                                            {"stats", required_argument, NULL, 'S'},
                                            {"timeout", required_argument, NULL, 't'},
                                            {"record", required_argument, NULL, 'r'},
                                            {"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
  const char *sock = NULL, *out = "-";
  uint64_t allocator = 0, device = 0;
  bool stats = false;
  const char *record = NULL;
  int c;
  while ((c = as_getopt("dump", argc, argv, ":o:h", longopts)) != -1) {
    switch (c) {
    case 's': sock = optarg; break;
    case 'o': out = optarg; break;
    case 'a':
      if (!as_parse_u64(optarg, 1000, &allocator))
        return as_usage_error("dump", "--allocator expects a number from 0 to 1000, got '%s'", optarg);
      break;
    case 'S':
      stats = true;
      if (!as_parse_u64(optarg, 1000, &device))
        return as_usage_error("dump", "--stats expects a device number, got '%s'", optarg);
      break;
    case 'r': record = optarg; break;
    case 't': {
      uint64_t t = 0;
      if (!as_parse_u64(optarg, 86400, &t) || t == 0)
        return as_usage_error("dump", "--timeout expects seconds from 1 to 86400, got '%s'", optarg);
      reply_timeout_s = (int)t;
      break;
    }
    case 'h':
      fputs(help, stdout);
      return as_finish_stdout("dump", AS_EXIT_OK);
    default: return AS_EXIT_USAGE;
    }
  }
  if (optind < argc)
    return as_usage_error("dump", "unexpected argument '%s'", argv[optind]);
  if (!sock)
    return as_usage_error("dump", "--socket PATH is required");
  if (stats && record)
    return as_usage_error("dump", "--stats and --record ask for different things: give one");
  char req[96];
  if (record && strcmp(record, "off") == 0) {
    snprintf(req, sizeof req, "record off %llu\n", (unsigned long long)allocator);
  } else if (record) {
    const char *comma = strchr(record, ',');
    char num[24];
    uint64_t entries = 0;
    const size_t len = comma ? (size_t)(comma - record) : strlen(record);
    if (len >= sizeof num || (comma && strcmp(comma, ",stacks") != 0))
      return as_usage_error("dump", "--record expects N, N,stacks or off, got '%s'", record);
    memcpy(num, record, len);
    num[len] = '\0';
    if (!as_parse_u64(num, 100000000, &entries) || entries == 0)
      return as_usage_error("dump", "--record expects N from 1 to 100000000 entries, got '%s'", record);
    snprintf(req, sizeof req, "record %llu%s %llu\n", (unsigned long long)entries, comma ? " stacks" : "",
             (unsigned long long)allocator);
  } else if (stats)
    snprintf(req, sizeof req, "stats %llu %llu\n", (unsigned long long)allocator, (unsigned long long)device);
  else
    snprintf(req, sizeof req, "snapshot %llu\n", (unsigned long long)allocator);
  int status = AS_EXIT_OK;
  size_t len = 0;
  char *reply = ask(sock, req, &len, &status);
  if (!reply)
    return status;
  /* cJSON_Parse stopped at the first NUL and took what came before it for the whole reply. */
  char name[160], why[AS_ERR_LEN];
  snprintf(name, sizeof name, "%s: the reply (%zu bytes)", sock, len);
  cJSON *doc = as_json_parse(name, reply, len, why);
  cJSON *err = doc ? cJSON_GetObjectItemCaseSensitive(doc, "error") : NULL;
  if (!doc)
    status = as_failure("dump", "%s", why);
  else if (!cJSON_IsObject(doc))
    status = as_failure("dump", "%s: the reply is not a JSON object (%zu bytes)", sock, len);
  else if (err)
    status = as_failure("dump", "%s: the process answered: %s", sock,
                        cJSON_IsString(err) ? err->valuestring : "an error");
  else
    status = as_write_output("dump", out, reply, len);
  cJSON_Delete(doc);
  free(reply);
  return strcmp(out, "-") == 0 ? as_finish_stdout("dump", status) : status;
}
