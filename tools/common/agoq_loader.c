/* Library lifecycle: dlopen as NCCL does, find the exported tables, check them, hand out
 * views. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr1, dl_iterate_phdr */
#endif
#include <ctype.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agoq_loader_internal.h"

struct agoq_netlib {
  void* handle;
  const void* net[AGOQ_LOADER_NUM_VERSIONS];  /* index: version - AGOQ_LOADER_MIN_VERSION */
  const void* coll[AGOQ_LOADER_NUM_VERSIONS];
};

__attribute__((format(printf, 3, 4))) static void agoq_loader_err(char* err, size_t errlen,
                                                                  const char* fmt, ...) {
  if (err == NULL || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static const void* agoq_loader_sym(void* handle, const char* prefix, int version) {
  char name[64];
  snprintf(name, sizeof name, "%s%d", prefix, version);
  return dlsym(handle, name);
}

/* ---- checking a table before anything calls through it ----
 * A library that is not a plugin (or exports a plugin's symbol name for something else)
 * must give an error, not a jump through garbage. NCCL trusts the table; the tools load
 * whatever --lib names, so they check: the symbol is an object at least as large as the
 * table of its version, its name is a short printable string in the library's loaded
 * memory, and every member that is set points into executable code of a loaded object. */

typedef struct {
  uintptr_t addr;
  size_t len;
  uint32_t need; /* PF_R / PF_X */
  uintptr_t seg_end; /* out: end of the segment holding addr (0: none) */
} agoq_loader_span;

static int agoq_loader_phdr_cb(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  agoq_loader_span* s = data;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)* ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || (ph->p_flags & s->need) != s->need) continue;
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
    if (s->addr >= lo && s->addr < hi && s->len <= hi - s->addr) {
      s->seg_end = hi;
      return 1;
    }
  }
  return 0;
}

/* Where [p, p + len) lies wholly in one loaded segment with the flags `need`: the end of
 * that segment; 0 otherwise. */
static uintptr_t agoq_loader_mapped(const void* p, size_t len, uint32_t need) {
  agoq_loader_span s = {.addr = (uintptr_t)p, .len = len, .need = need};
  if (p == NULL) return 0;
  dl_iterate_phdr(agoq_loader_phdr_cb, &s);
  return s.seg_end;
}

static size_t agoq_loader_table_size(bool coll, int v) {
  static const size_t net[] = {sizeof(ncclNet_v6_t), sizeof(ncclNet_v7_t), sizeof(ncclNet_v8_t),
                               sizeof(ncclNet_v9_t), sizeof(ncclNet_v10_t), sizeof(ncclNet_v11_t),
                               sizeof(ncclNet_v12_t)};
  static const size_t cnet[] = {sizeof(ncclCollNet_v6_t), sizeof(ncclCollNet_v7_t),
                                sizeof(ncclCollNet_v8_t), sizeof(ncclCollNet_v9_t),
                                sizeof(ncclCollNet_v10_t), sizeof(ncclCollNet_v11_t),
                                sizeof(ncclCollNet_v12_t)};
  _Static_assert(sizeof net / sizeof net[0] == AGOQ_LOADER_NUM_VERSIONS, "one size per version");
  _Static_assert(sizeof cnet / sizeof cnet[0] == AGOQ_LOADER_NUM_VERSIONS, "one size per version");
  return coll ? cnet[v - AGOQ_LOADER_MIN_VERSION] : net[v - AGOQ_LOADER_MIN_VERSION];
}

/* 0 when `table` (symbol `sym`) can be used as that version's table; else -1 and why. */
static int agoq_loader_table_check(const void* table, const char* sym, bool coll, int v,
                                   char* why, size_t whylen) {
  size_t size = agoq_loader_table_size(coll, v);
  Dl_info info;
  const ElfW(Sym)* es = NULL;
  if (dladdr1(table, &info, (void**)&es, RTLD_DL_SYMENT) == 0 || es == NULL) {
    snprintf(why, whylen, "%s is not a symbol of a loaded object", sym);
    return -1;
  }
  if (ELF64_ST_TYPE(es->st_info) != STT_OBJECT || es->st_size < size) {
    snprintf(why, whylen, "%s is a %s of %zu B, not a %zu-byte v%d table",
             sym, ELF64_ST_TYPE(es->st_info) == STT_FUNC ? "function" : "symbol",
             (size_t)es->st_size, size, v);
    return -1;
  }
  if (agoq_loader_mapped(table, size, PF_R) == 0) {
    snprintf(why, whylen, "%s does not lie in readable memory", sym);
    return -1;
  }
  const char* name = *(const char* const*)table;
  uintptr_t end = agoq_loader_mapped(name, 1, PF_R);
  size_t n = 0;
  /* Names are short ("AGOQ", "IB", "Socket"): NUL within 64 bytes, all printable. */
  while (end != 0 && (uintptr_t)(name + n) < end && n < 64 && name[n] != '\0' &&
         isprint((unsigned char)name[n]))
    n++;
  if (end == 0 || n == 0 || (uintptr_t)(name + n) >= end || name[n] != '\0') {
    snprintf(why, whylen, "%s has no valid name string", sym);
    return -1;
  }
  const void* const* fns = (const void* const*)table + 1; /* every member after the name */
  size_t nfns = (size - sizeof(void*)) / sizeof(void*);
  for (size_t i = 0; i < nfns; i++) {
    if (i < 3 && fns[i] == NULL) { /* init, devices, getProperties: NCCL calls them first */
      snprintf(why, whylen, "%s member %zu (of init/devices/getProperties) is NULL", sym, i + 1);
      return -1;
    }
    if (fns[i] != NULL && agoq_loader_mapped(fns[i], 1, PF_X) == 0) {
      snprintf(why, whylen, "%s member %zu does not point into code", sym, i + 1);
      return -1;
    }
  }
  return 0;
}

int agoq_netlib_open(const char* path, agoq_netlib** out, char* err, size_t errlen) {
  if (path == NULL || out == NULL) {
    agoq_loader_err(err, errlen, "agoq_netlib_open: NULL %s", path == NULL ? "path" : "out");
    return -1;
  }
  *out = NULL;
  agoq_netlib* lib = calloc(1, sizeof(*lib));
  if (lib == NULL) {
    agoq_loader_err(err, errlen, "out of memory");
    return -1;
  }
  /* NCCL's flags: every undefined symbol must resolve now, and nothing leaks globally. */
  lib->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib->handle == NULL) {
    agoq_loader_err(err, errlen, "dlopen(%s): %s", path, dlerror());
    free(lib);
    return -1;
  }
  int found = 0;
  for (int v = AGOQ_LOADER_MIN_VERSION; v <= AGOQ_LOADER_MAX_VERSION; v++) {
    lib->net[v - AGOQ_LOADER_MIN_VERSION] = agoq_loader_sym(lib->handle, "ncclNetPlugin_v", v);
    lib->coll[v - AGOQ_LOADER_MIN_VERSION] =
        agoq_loader_sym(lib->handle, "ncclCollNetPlugin_v", v);
    for (int c = 0; c < 2; c++) {
      const void* t = c ? lib->coll[v - AGOQ_LOADER_MIN_VERSION] : lib->net[v - AGOQ_LOADER_MIN_VERSION];
      char sym[64], why[160];
      snprintf(sym, sizeof sym, "%s%d", c ? "ncclCollNetPlugin_v" : "ncclNetPlugin_v", v);
      if (t != NULL && agoq_loader_table_check(t, sym, c != 0, v, why, sizeof why) != 0) {
        agoq_loader_err(err, errlen, "%s is not a usable NCCL plugin: %s", path, why);
        dlclose(lib->handle);
        free(lib);
        return -1;
      }
    }
    if (lib->net[v - AGOQ_LOADER_MIN_VERSION] != NULL) found++;
  }
  if (found == 0) {
    agoq_loader_err(err, errlen, "%s exports none of ncclNetPlugin_v%d..v%d", path,
                    AGOQ_LOADER_MIN_VERSION, AGOQ_LOADER_MAX_VERSION);
    dlclose(lib->handle);
    free(lib);
    return -1;
  }
  *out = lib;
  return 0;
}

void agoq_netlib_close(agoq_netlib* lib) {
  if (lib == NULL) return;
  dlclose(lib->handle);
  free(lib);
}

const char* agoq_netlib_default_path(void) {
  static char path[PATH_MAX + 32];
  const char* env = getenv("AGOQ_PLUGIN_PATH");
  if (env != NULL && *env != '\0') return env;
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  char* slash = n > 0 ? memrchr(exe, '/', (size_t)n) : NULL;
  /* Without our own location, let the dynamic linker's search path find it. */
  if (slash == NULL) return "libnccl-net-agoq.so";
  *slash = '\0';
  snprintf(path, sizeof(path), "%s/../lib/libnccl-net-agoq.so", exe);
  return path;
}

static int agoq_loader_list(const void* const* tables, int* versions, int max) {
  int count = 0;
  for (int v = AGOQ_LOADER_MAX_VERSION; v >= AGOQ_LOADER_MIN_VERSION && count < max; v--)
    if (tables[v - AGOQ_LOADER_MIN_VERSION] != NULL) versions[count++] = v;
  return count;
}

int agoq_netlib_net_versions(agoq_netlib* lib, int* versions, int max) {
  return agoq_loader_list(lib->net, versions, max);
}

int agoq_netlib_collnet_versions(agoq_netlib* lib, int* versions, int max) {
  return agoq_loader_list(lib->coll, versions, max);
}

static const void* agoq_loader_table(const void* const* tables, int version) {
  if (version < AGOQ_LOADER_MIN_VERSION || version > AGOQ_LOADER_MAX_VERSION) return NULL;
  return tables[version - AGOQ_LOADER_MIN_VERSION];
}

/* Every table version starts with its name. */
static const char* agoq_loader_table_name(const void* table) {
  return *(const char* const*)table;
}

int agoq_netlib_net_view(agoq_netlib* lib, int version, agoq_net_view* view) {
  const void* table = agoq_loader_table(lib->net, version);
  if (table == NULL) return -1;
  *view = (agoq_net_view){.version = version, .table = table, .name = agoq_loader_table_name(table)};
  return 0;
}

int agoq_netlib_collnet_view(agoq_netlib* lib, int version, agoq_collnet_view* view) {
  const void* table = agoq_loader_table(lib->coll, version);
  if (table == NULL) return -1;
  *view = (agoq_collnet_view){
      .version = version, .table = table, .name = agoq_loader_table_name(table)};
  return 0;
}

ncclResult_t agoq_view_missing(int version, const char* member) {
  agoq_log_stderr(NCCL_LOG_WARN, NCCL_NET, __FILE__, __LINE__,
                  "loader: v%d table has no %s", version, member);
  return ncclInternalError;
}

ncclResult_t agoq_view_bad_version(int version) {
  agoq_log_stderr(NCCL_LOG_WARN, NCCL_NET, __FILE__, __LINE__,
                  "loader: no view for ABI version %d", version);
  return ncclInternalError;
}

const void* agoq_netlib_symbol(agoq_netlib* lib, const char* name) {
  return lib != NULL && lib->handle != NULL && name != NULL ? dlsym(lib->handle, name) : NULL;
}
