/* Finds libhwloc at run time and checks it speaks the API we were compiled against. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "agoq_topo.h"
#include "agoq_topo_hwloc.h"

static pthread_once_t agoq_topo_hwloc_once = PTHREAD_ONCE_INIT;
static agoq_topo_hwloc_api agoq_topo_hwloc_fns;
static const agoq_topo_hwloc_api* agoq_topo_hwloc_ready;
static char agoq_topo_hwloc_why[256];

static void agoq_topo_hwloc_load(void) {
  void* lib = dlopen(AGOQ_TOPO_HWLOC_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    snprintf(agoq_topo_hwloc_why, sizeof agoq_topo_hwloc_why, "%s", dlerror());
    return;
  }
  agoq_topo_hwloc_api* f = &agoq_topo_hwloc_fns;
  struct {
    const char* name;
    void** slot;
    int optional;
  } syms[] = {
#define AGOQ_SYM(field, name, optional) {name, (void**)&f->field, optional}
      AGOQ_SYM(get_api_version, "hwloc_get_api_version", 0),
      AGOQ_SYM(topology_init, "hwloc_topology_init", 0),
      AGOQ_SYM(topology_destroy, "hwloc_topology_destroy", 0),
      AGOQ_SYM(topology_load, "hwloc_topology_load", 0),
      AGOQ_SYM(topology_set_io_types_filter, "hwloc_topology_set_io_types_filter", 0),
      AGOQ_SYM(topology_set_xml, "hwloc_topology_set_xml", 0),
      AGOQ_SYM(topology_set_xmlbuffer, "hwloc_topology_set_xmlbuffer", 0),
      AGOQ_SYM(topology_set_components, "hwloc_topology_set_components", 1), /* 2.1+ */
      AGOQ_SYM(topology_is_thissystem, "hwloc_topology_is_thissystem", 0),
      AGOQ_SYM(get_type_depth, "hwloc_get_type_depth", 0),
      AGOQ_SYM(get_nbobjs_by_depth, "hwloc_get_nbobjs_by_depth", 0),
      AGOQ_SYM(get_obj_by_depth, "hwloc_get_obj_by_depth", 0),
      AGOQ_SYM(bitmap_first, "hwloc_bitmap_first", 0),
      AGOQ_SYM(bitmap_next, "hwloc_bitmap_next", 0),
      AGOQ_SYM(bitmap_weight, "hwloc_bitmap_weight", 0),
#undef AGOQ_SYM
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    /* POSIX guarantees a data pointer from dlsym converts to a function pointer. */
    *syms[i].slot = dlsym(lib, syms[i].name);
    if (*syms[i].slot == NULL && !syms[i].optional) {
      snprintf(agoq_topo_hwloc_why, sizeof agoq_topo_hwloc_why, "%s lacks %s", AGOQ_TOPO_HWLOC_SONAME, syms[i].name);
      dlclose(lib);
      return;
    }
  }
  /* struct hwloc_obj's layout is fixed within a major version (hwloc.h: compare >> 16). */
  unsigned have = f->get_api_version();
  if ((have >> 16) != (HWLOC_API_VERSION >> 16)) {
    snprintf(agoq_topo_hwloc_why, sizeof agoq_topo_hwloc_why, "%s has API 0x%x, built for 0x%x", AGOQ_TOPO_HWLOC_SONAME,
             have, (unsigned)HWLOC_API_VERSION);
    dlclose(lib);
    return;
  }
  agoq_topo_hwloc_ready = f;
}

const agoq_topo_hwloc_api* agoq_topo_hwloc_api_get(char* why, size_t len) {
  pthread_once(&agoq_topo_hwloc_once, agoq_topo_hwloc_load);
  if (agoq_topo_hwloc_ready == NULL && why != NULL && len > 0) snprintf(why, len, "%s", agoq_topo_hwloc_why);
  return agoq_topo_hwloc_ready;
}

bool agoq_topo_hwloc_available(char* why, size_t len) { return agoq_topo_hwloc_api_get(why, len) != NULL; }
