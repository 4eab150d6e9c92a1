/* Built instead of the hwloc back end when AGOQ_HWLOC=OFF or hwloc.h is missing: every
 * hwloc entry point says so and callers take the sysfs path. */
#include <stdio.h>

#include "agoq_topo.h"

bool agoq_topo_hwloc_available(char* why, size_t len) {
  if (why != NULL && len > 0) snprintf(why, len, "agoq was built without hwloc (AGOQ_HWLOC=OFF or no hwloc.h)");
  return false;
}

int agoq_topo_discover_hwloc(agoq_topo* t) {
  (void)t;
  return AGOQ_TOPO_ENOHWLOC;
}

int agoq_topo_load_xml(const char* path, agoq_topo* t) {
  (void)path;
  (void)t;
  return AGOQ_TOPO_ENOHWLOC;
}

int agoq_topo_load_xml_buffer(const char* buf, int len, agoq_topo* t) {
  (void)buf;
  (void)len;
  (void)t;
  return AGOQ_TOPO_ENOHWLOC;
}
