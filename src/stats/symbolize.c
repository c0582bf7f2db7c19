/* Symbolization of recorded C stacks at snapshot time. With libdw (elfutils): the process's own modules
 * through dwfl, so names come from the full symbol table (static functions too) and files and lines from
 * DWARF where debug info exists (in the object or a separate debug file). libdw is never linked: the
 * first symbolization of the process opens libdw.so.1 (libdw1) and binds the functions below by their
 * symbol versions, so that a static link of libcachalot needs nothing of elfutils and a program runs the
 * same without it. Without it (not installed, a function missing, or -Dlibdw=disabled), or where dwfl
 * finds no module: dladdr, which knows exported (dynamic) symbols and object files only, line 0.
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
#include <elf.h>
#include <stddef.h>
#include <sys/types.h>
#ifdef CL_SYMBOLIZE_CHECK_LIBDW_DECLS
/* A test build (tests/meson.build) compiles this file after libdw's own headers, where they are installed:
 * every typedef and function type below must then agree with them, or the build fails. */
#include <elfutils/libdwfl.h>
#endif

/* libdw's ABI as its headers declare it: handles are opaque, addresses are 64-bit on every target. */
typedef struct Dwfl Dwfl;
typedef struct Dwfl_Module Dwfl_Module;
typedef struct Dwfl_Line Dwfl_Line;
typedef struct Dwarf_Line_s Dwarf_Line;
typedef struct Elf Elf;
typedef uint64_t Dwarf_Addr;
typedef uint64_t Dwarf_Word;
typedef uint64_t GElf_Addr;
typedef uint64_t GElf_Off;
typedef uint32_t GElf_Word;
typedef Elf64_Sym GElf_Sym;
typedef Elf64_Shdr GElf_Shdr;

typedef int dwfl_find_elf_fn(Dwfl_Module *, void **, const char *, Dwarf_Addr, char **, Elf **);
typedef int dwfl_find_debuginfo_fn(Dwfl_Module *, void **, const char *, Dwarf_Addr, const char *, const char *,
                                   GElf_Word, char **);
typedef int dwfl_section_address_fn(Dwfl_Module *, void **, const char *, Dwarf_Addr, const char *, GElf_Word,
                                    const GElf_Shdr *, Dwarf_Addr *);
typedef int dwfl_removed_fn(Dwfl_Module *, void *, const char *, Dwarf_Addr, void *);
typedef struct {
  dwfl_find_elf_fn *find_elf;
  dwfl_find_debuginfo_fn *find_debuginfo;
  dwfl_section_address_fn *section_address;
  char **debuginfo_path;
} cl_dwfl_callbacks;

/* Dwfl_Callbacks and Dwarf_Die are untagged structs in libdw's headers, which no declaration here can
 * name again: Dwarf_Die only passes by pointer, and the callbacks' layout is compared member by member. */
#ifdef CL_SYMBOLIZE_CHECK_LIBDW_DECLS
#define SAME_MEMBER(m, type)                                                                                 \
  _Static_assert(offsetof(cl_dwfl_callbacks, m) == offsetof(Dwfl_Callbacks, m) &&                          \
                     _Generic(((Dwfl_Callbacks *)0)->m, type: 1, default: 0),                                 \
                 "Dwfl_Callbacks." #m " differs from libdw's");
SAME_MEMBER(find_elf, dwfl_find_elf_fn *)
SAME_MEMBER(find_debuginfo, dwfl_find_debuginfo_fn *)
SAME_MEMBER(section_address, dwfl_section_address_fn *)
SAME_MEMBER(debuginfo_path, char **)
_Static_assert(sizeof(cl_dwfl_callbacks) == sizeof(Dwfl_Callbacks), "Dwfl_Callbacks differs from libdw's");
#else
typedef cl_dwfl_callbacks Dwfl_Callbacks;
typedef struct cl_dwarf_die Dwarf_Die;
#endif

/* What is bound, with the symbol version it is bound at: the version fixes the ABI declared here, whatever
 * later elfutils add. */
#define LIBDW_FUNCTIONS(X)                                                                                    \
  X(dwfl_begin, "ELFUTILS_0.122", Dwfl *, (const Dwfl_Callbacks *))                                          \
  X(dwfl_end, "ELFUTILS_0.122", void, (Dwfl *))                                                              \
  X(dwfl_linux_proc_report, "ELFUTILS_0.122", int, (Dwfl *, pid_t))                                          \
  X(dwfl_report_end, "ELFUTILS_0.122", int, (Dwfl *, dwfl_removed_fn *, void *))                             \
  X(dwfl_linux_proc_find_elf, "ELFUTILS_0.122", int,                                                         \
    (Dwfl_Module *, void **, const char *, Dwarf_Addr, char **, Elf **))                                     \
  X(dwfl_standard_find_debuginfo, "ELFUTILS_0.122", int,                                                     \
    (Dwfl_Module *, void **, const char *, Dwarf_Addr, const char *, const char *, GElf_Word, char **))      \
  X(dwfl_addrmodule, "ELFUTILS_0.122", Dwfl_Module *, (Dwfl *, Dwarf_Addr))                                  \
  X(dwfl_module_addrinfo, "ELFUTILS_0.158", const char *,                                                    \
    (Dwfl_Module *, GElf_Addr, GElf_Off *, GElf_Sym *, GElf_Word *, Elf **, Dwarf_Addr *))                    \
  X(dwfl_module_getsrc, "ELFUTILS_0.122", Dwfl_Line *, (Dwfl_Module *, Dwarf_Addr))                          \
  X(dwfl_lineinfo, "ELFUTILS_0.122", const char *,                                                           \
    (Dwfl_Line *, Dwarf_Addr *, int *, int *, Dwarf_Word *, Dwarf_Word *))                                   \
  X(dwfl_module_info, "ELFUTILS_0.122", const char *,                                                        \
    (Dwfl_Module *, void ***, Dwarf_Addr *, Dwarf_Addr *, Dwarf_Addr *, Dwarf_Addr *, const char **,          \
     const char **))                                                                                         \
  X(dwfl_module_nextcu, "ELFUTILS_0.122", Dwarf_Die *, (Dwfl_Module *, Dwarf_Die *, Dwarf_Addr *))           \
  X(dwarf_haspc, "ELFUTILS_0.122", int, (Dwarf_Die *, Dwarf_Addr))                                           \
  X(dwarf_getsrc_die, "ELFUTILS_0.122", Dwarf_Line *, (Dwarf_Die *, Dwarf_Addr))                             \
  X(dwarf_lineno, "ELFUTILS_0.122", int, (Dwarf_Line *, int *))                                              \
  X(dwarf_linesrc, "ELFUTILS_0.122", const char *, (Dwarf_Line *, Dwarf_Word *, Dwarf_Word *))

#define FUNCTION_TYPE(name, version, ret, params) typedef ret name##_fn params;
LIBDW_FUNCTIONS(FUNCTION_TYPE)
#ifdef CL_SYMBOLIZE_CHECK_LIBDW_DECLS
/* declared again through the types above: a redeclaration that differs from libdw's is an error */
#define REDECLARE(name, version, ret, params) extern name##_fn name;
LIBDW_FUNCTIONS(REDECLARE)
#endif

#define FUNCTION_FIELD(name, version, ret, params) name##_fn *name;
static struct {
  LIBDW_FUNCTIONS(FUNCTION_FIELD)
} libdw;
static Dwfl_Callbacks libdw_callbacks;
static bool libdw_loaded;
static const char *libdw_soname = "libdw.so.1";
static pthread_once_t libdw_once = PTHREAD_ONCE_INIT;

_Static_assert(sizeof(void *) == sizeof(dwfl_begin_fn *), "dlvsym's result converts to a function pointer");

static bool bind_versioned(void *lib, const char *name, const char *version, void *slot) {
  void *f = dlvsym(lib, name, version);
  if (!f)
    return false;
  memcpy(slot, &f, sizeof f);
  return true;
}

/* Kept loaded once bound: each snapshot's dwfl session calls into it, and nothing is gained by closing. */
static void load_libdw(void) {
  void *lib = libdw_soname ? dlopen(libdw_soname, RTLD_LAZY | RTLD_LOCAL) : NULL;
  if (!lib)
    return;
  bool ok = true;
#define BIND(name, version, ret, params) ok = ok && bind_versioned(lib, #name, version, &libdw.name);
  LIBDW_FUNCTIONS(BIND)
  if (!ok) { /* an elfutils without one of them: dladdr, as without libdw */
    memset(&libdw, 0, sizeof libdw);
    dlclose(lib);
    return;
  }
  libdw_callbacks.find_elf = libdw.dwfl_linux_proc_find_elf;
  libdw_callbacks.find_debuginfo = libdw.dwfl_standard_find_debuginfo;
  libdw_loaded = true;
}

static bool libdw_ready(void) {
  pthread_once(&libdw_once, load_libdw);
  return libdw_loaded;
}

void cl_symbolize_libdw_soname(const char *soname) { libdw_soname = soname; }
#else
void cl_symbolize_libdw_soname(const char *soname) { (void)soname; }
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
  return libdw_ready();
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
    libdw.dwfl_end(s->dwfl);
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
  if (s->dwfl_tried)
    return s->dwfl;
  s->dwfl_tried = true;
  Dwfl *dwfl = libdw_ready() ? libdw.dwfl_begin(&libdw_callbacks) : NULL;
  if (!dwfl)
    return NULL;
  /* the modules mapped now: a snapshot is taken after the stacks it names were recorded */
  if (libdw.dwfl_linux_proc_report(dwfl, getpid()) != 0 || libdw.dwfl_report_end(dwfl, NULL, NULL) != 0) {
    libdw.dwfl_end(dwfl);
    return NULL;
  }
  s->dwfl = dwfl;
  return dwfl;
}

/* The source file and line of pc from the compile unit whose ranges cover it. dwfl_module_getsrc finds
 * units through .debug_aranges, which clang does not emit. */
static const char *cu_line(Dwfl_Module *m, uintptr_t pc, int *line) {
  Dwarf_Addr bias = 0;
  for (Dwarf_Die *cu = libdw.dwfl_module_nextcu(m, NULL, &bias); cu; cu = libdw.dwfl_module_nextcu(m, cu, &bias)) {
    if (libdw.dwarf_haspc(cu, (Dwarf_Addr)pc - bias) != 1)
      continue;
    Dwarf_Line *l = libdw.dwarf_getsrc_die(cu, (Dwarf_Addr)pc - bias);
    if (!l || libdw.dwarf_lineno(l, line) != 0)
      return NULL;
    return libdw.dwarf_linesrc(l, NULL, NULL);
  }
  return NULL;
}

/* dwfl: the full symbol table and DWARF lines. pc is inside the call instruction. */
static void lookup_dwfl(cl_symbolizer *s, uintptr_t pc, cached_frame *f) {
  Dwfl *dwfl = process_dwfl(s);
  Dwfl_Module *m = dwfl ? libdw.dwfl_addrmodule(dwfl, (Dwarf_Addr)pc) : NULL;
  if (!m)
    return;
  GElf_Off off;
  GElf_Sym sym;
  const char *name = libdw.dwfl_module_addrinfo(m, (GElf_Addr)pc, &off, &sym, NULL, NULL, NULL);
  if (name && name[0])
    f->name = name_copy(name);
  Dwfl_Line *l = libdw.dwfl_module_getsrc(m, (Dwarf_Addr)pc);
  int line = 0;
  const char *file = l ? libdw.dwfl_lineinfo(l, NULL, &line, NULL, NULL, NULL) : cu_line(m, pc, &line);
  if (file && file[0]) {
    f->filename = strdup(file);
    f->line = line;
    return;
  }
  const char *mainfile = NULL;
  libdw.dwfl_module_info(m, NULL, NULL, NULL, NULL, NULL, &mainfile, NULL);
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
