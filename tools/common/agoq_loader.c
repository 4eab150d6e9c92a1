/* Library lifecycle: dlopen as NCCL does, find the exported tables, hand out views. */
#include <dlfcn.h>
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
