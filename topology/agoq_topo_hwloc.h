/*
 * hwloc reached through dlopen: the plugin must load on hosts without libhwloc, so it
 * never links it. We compile against hwloc.h for the layout of struct hwloc_obj (stable
 * within a major version, checked at run time) and call only functions libhwloc exports;
 * hwloc.h's inline helpers would call symbols we did not resolve, so the walks they do are
 * rewritten over the public parent/children pointers.
 */
#ifndef AGOQ_TOPO_HWLOC_H
#define AGOQ_TOPO_HWLOC_H

#include <hwloc.h>
#include <stddef.h>

#define AGOQ_TOPO_HWLOC_SONAME "libhwloc.so.15"

typedef struct {
  unsigned (*get_api_version)(void);
  int (*topology_init)(hwloc_topology_t*);
  void (*topology_destroy)(hwloc_topology_t);
  int (*topology_load)(hwloc_topology_t);
  int (*topology_set_io_types_filter)(hwloc_topology_t, enum hwloc_type_filter_e);
  int (*topology_set_xml)(hwloc_topology_t, const char*);
  int (*topology_set_xmlbuffer)(hwloc_topology_t, const char*, int);
  int (*topology_set_components)(hwloc_topology_t, unsigned long, const char*); /* may be NULL */
  int (*topology_is_thissystem)(hwloc_topology_t);
  int (*get_type_depth)(hwloc_topology_t, hwloc_obj_type_t);
  unsigned (*get_nbobjs_by_depth)(hwloc_topology_t, int);
  hwloc_obj_t (*get_obj_by_depth)(hwloc_topology_t, int, unsigned);
  int (*bitmap_first)(hwloc_const_bitmap_t);
  int (*bitmap_next)(hwloc_const_bitmap_t, int);
  int (*bitmap_weight)(hwloc_const_bitmap_t);
} agoq_topo_hwloc_api;

/* The resolved functions, or NULL with the reason in `why`. Loaded once per process;
 * the library stays loaded (hwloc keeps plugin state we must not unmap under it). */
const agoq_topo_hwloc_api* agoq_topo_hwloc_api_get(char* why, size_t len);

#endif
