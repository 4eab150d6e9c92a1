/* libibverbs through dlopen and dlvsym: see agoq_ibv_load.h. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "transport/ib/agoq_ibv_load.h"

/* One row per entry point, from the same list that declares the members, so a name, its
 * version and its slot cannot drift apart. */
typedef struct {
  const char* symbol;
  const char* version;
  bool required;
  size_t offset;
} agoq_ibv_binding;

static const agoq_ibv_binding agoq_ibv_bindings[] = {
#define AGOQ_IBV_BINDING_ROW(name, sym, ver, req, ret, params) {sym, ver, req, offsetof(agoq_ibv_api, name)},
    AGOQ_IBV_FUNCTIONS(AGOQ_IBV_BINDING_ROW)
#undef AGOQ_IBV_BINDING_ROW
};

int agoq_ibv_api_load(const char* path, agoq_ibv_api* api, char* why, size_t why_len) {
  memset(api, 0, sizeof *api);
  if (path == NULL || path[0] == '\0') path = AGOQ_IBV_DEFAULT_LIBRARY;
  snprintf(api->path, sizeof api->path, "%s", path);
  /* RTLD_LOCAL: libibverbs' names must not resolve anyone else's symbols, and a process
   * that links libibverbs itself keeps its own copy's state. */
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    const char* err = dlerror();
    snprintf(why, why_len, "cannot load %s: %s", path, err ? err : "unknown dlopen error");
    return ENOENT;
  }
  for (size_t i = 0; i < sizeof agoq_ibv_bindings / sizeof agoq_ibv_bindings[0]; i++) {
    const agoq_ibv_binding* b = &agoq_ibv_bindings[i];
    void* fn = dlvsym(h, b->symbol, b->version);
    if (fn == NULL && b->required) {
      snprintf(why, why_len, "%s has no %s@%s (not libibverbs, or older than rdma-core v13)", path, b->symbol,
               b->version);
      dlclose(h);
      memset(api, 0, sizeof *api);
      return ENOSYS;
    }
    /* A function pointer stored through its slot's address: the table's members are all
     * function pointers of the declared types, laid out by the same list. */
    memcpy((char*)api + b->offset, &fn, sizeof fn);
  }
  api->handle = h;
  return 0;
}

void agoq_ibv_api_unload(agoq_ibv_api* api) {
  if (api->handle != NULL) dlclose(api->handle);
  memset(api, 0, sizeof *api);
}
