/*
 * hwloc topology -> agoq_topo: NUMA nodes with their CPUs, GPUs (PCI class 03xx of GPU
 * vendors: Debian's hwloc has no CUDA/NVML backend, so there is no cuda0 OS device to find),
 * NICs (OpenFabrics OS devices, one entry per port, and network OS devices that have no
 * OpenFabrics sibling), and for each PCI device the bridges above it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_topo.h"
#include "agoq_topo_hwloc.h"
#include "agoq_topo_internal.h"

static const char* agoq_topo_obj_info(hwloc_obj_t obj, const char* name) {
  /* hwloc_obj_get_info_by_name is inline; the infos array is public. */
  for (unsigned i = 0; i < obj->infos_count; i++)
    if (obj->infos[i].name != NULL && strcmp(obj->infos[i].name, name) == 0) return obj->infos[i].value;
  return NULL;
}

static void agoq_topo_bitmap_to_cpuset(const agoq_topo_hwloc_api* h, hwloc_const_bitmap_t bm, cpu_set_t* out) {
  CPU_ZERO(out);
  if (bm == NULL) return;
  for (int i = h->bitmap_first(bm); i >= 0 && i < CPU_SETSIZE; i = h->bitmap_next(bm, i)) CPU_SET(i, out);
}

/* NUMA node an I/O object is local to: the one node of its first non-I/O ancestor (I/O
 * objects have no cpuset). Several nodes (a device attached to a whole machine) = -1,
 * as Linux reports numa_node for such devices. */
static int agoq_topo_obj_numa(const agoq_topo_hwloc_api* h, hwloc_obj_t obj) {
  while (obj != NULL && obj->cpuset == NULL) obj = obj->parent;
  if (obj == NULL || obj->nodeset == NULL || h->bitmap_weight(obj->nodeset) != 1) return -1;
  return h->bitmap_first(obj->nodeset);
}

static void agoq_topo_fmt_busid(char* buf, unsigned domain, unsigned bus, unsigned dev, unsigned func) {
  snprintf(buf, AGOQ_TOPO_BUSID_LEN, "%04x:%02x:%02x.%01x", domain & 0xffffu, bus & 0xffu, dev & 0x1fu, func & 0x7u);
}

/* Bridges from the host bridge down to `pcidev`. */
static void agoq_topo_fill_pci(const agoq_topo_hwloc_api* h, hwloc_obj_t pcidev, agoq_topo_pci* p) {
  memset(p, 0, sizeof *p);
  const struct hwloc_pcidev_attr_s* a = &pcidev->attr->pcidev;
  agoq_topo_fmt_busid(p->busid, a->domain, a->bus, a->dev, a->func);
  p->domain = a->domain;
  p->root_bus = a->bus;
  char up[AGOQ_TOPO_MAX_DEPTH][AGOQ_TOPO_BUSID_LEN];
  int n = 0;
  for (hwloc_obj_t o = pcidev->parent; o != NULL && o->type == HWLOC_OBJ_BRIDGE; o = o->parent) {
    const struct hwloc_bridge_attr_s* b = &o->attr->bridge;
    if (b->upstream_type == HWLOC_OBJ_BRIDGE_HOST) {
      /* The host bridge is not a PCI function: it names the root bus, pci<domain>:<bus>. */
      if (b->downstream_type == HWLOC_OBJ_BRIDGE_PCI) {
        p->domain = b->downstream.pci.domain;
        p->root_bus = b->downstream.pci.secondary_bus;
      }
      break;
    }
    if (n < AGOQ_TOPO_MAX_DEPTH) {
      const struct hwloc_pcidev_attr_s* u = &b->upstream.pci;
      agoq_topo_fmt_busid(up[n], u->domain, u->bus, u->dev, u->func);
      p->root_bus = u->bus; /* if no host bridge follows: the top bridge's own bus */
      n++;
    }
  }
  p->nbridges = n;
  for (int i = 0; i < n; i++) memcpy(p->bridges[i], up[n - 1 - i], AGOQ_TOPO_BUSID_LEN);
  p->numa = agoq_topo_obj_numa(h, pcidev);
}

/* The PCI device an OS device hangs from, or NULL (virtual devices). */
static hwloc_obj_t agoq_topo_osdev_pci(hwloc_obj_t osdev) {
  hwloc_obj_t p = osdev->parent;
  return p != NULL && p->type == HWLOC_OBJ_PCI_DEVICE ? p : NULL;
}

static uint64_t agoq_topo_parse_guid(const char* s) {
  /* hwloc prints GUIDs as "0c42:a103:0012:3456". */
  uint64_t v = 0;
  int digits = 0;
  for (; s != NULL && *s != '\0' && digits < 16; s++) {
    int d;
    if (*s >= '0' && *s <= '9') d = *s - '0';
    else if (*s >= 'a' && *s <= 'f') d = *s - 'a' + 10;
    else if (*s >= 'A' && *s <= 'F') d = *s - 'A' + 10;
    else continue;
    v = v << 4 | (uint64_t)d;
    digits++;
  }
  return v;
}

/* Highest N with a "Port<N>State" info: hwloc lists every port of an IB device. */
static int agoq_topo_ib_ports(hwloc_obj_t osdev) {
  int max = 0;
  for (unsigned i = 0; i < osdev->infos_count; i++) {
    unsigned port;
    char tail[8];
    const char* name = osdev->infos[i].name;
    if (name != NULL && sscanf(name, "Port%u%7s", &port, tail) == 2 && strcmp(tail, "State") == 0 && port < 64 &&
        (int)port > max)
      max = (int)port;
  }
  return max;
}

static agoq_topo_nic* agoq_topo_add_nic(agoq_topo* t, const agoq_topo_hwloc_api* h, hwloc_obj_t osdev) {
  if (t->nnics >= AGOQ_TOPO_MAX_NICS) return NULL;
  agoq_topo_nic* nic = &t->nics[t->nnics++];
  memset(nic, 0, sizeof *nic);
  nic->speed_mbps = -1;
  hwloc_obj_t pci = agoq_topo_osdev_pci(osdev);
  if (pci != NULL) {
    nic->has_pci = true;
    agoq_topo_fill_pci(h, pci, &nic->pci);
  }
  return nic;
}

static void agoq_topo_walk_nics(agoq_topo* t, const agoq_topo_hwloc_api* h, hwloc_topology_t topo) {
  unsigned n = h->get_nbobjs_by_depth(topo, HWLOC_TYPE_DEPTH_OS_DEVICE);
  /* Pass 0: InfiniBand/RoCE devices, one NIC per port. Pass 1: IP interfaces, attached
   * to the IB NIC on the same PCI device, or NICs of their own. */
  for (int pass = 0; pass < 2; pass++) {
    for (unsigned i = 0; i < n; i++) {
      hwloc_obj_t o = h->get_obj_by_depth(topo, HWLOC_TYPE_DEPTH_OS_DEVICE, i);
      if (o == NULL || o->name == NULL) continue;
      if (pass == 0 && o->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
        int ports = agoq_topo_ib_ports(o);
        for (int port = 1; port <= (ports > 0 ? ports : 1); port++) {
          agoq_topo_nic* nic = agoq_topo_add_nic(t, h, o);
          if (nic == NULL) return;
          nic->kind = AGOQ_TOPO_NIC_IB;
          nic->port = port;
          nic->guid = agoq_topo_parse_guid(agoq_topo_obj_info(o, "NodeGUID"));
          if (ports > 1) snprintf(nic->name, sizeof nic->name, "%.48s:%d", o->name, port);
          else agoq_topo_strlcpy(nic->name, sizeof nic->name, o->name);
          agoq_topo_strlcpy(nic->ibdev, sizeof nic->ibdev, o->name);
        }
      } else if (pass == 1 && o->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK) {
        if (strlen(o->name) > IF_NAMESIZE) continue;
        hwloc_obj_t pci = agoq_topo_osdev_pci(o);
        agoq_topo_nic* owner = NULL;
        const char* port_info = agoq_topo_obj_info(o, "Port");
        int want_port = port_info != NULL ? atoi(port_info) : 0;
        for (int k = 0; pci != NULL && k < t->nnics; k++) {
          agoq_topo_nic* c = &t->nics[k];
          if (c->kind != AGOQ_TOPO_NIC_IB || !c->has_pci || c->netdev[0] != '\0') continue;
          char busid[AGOQ_TOPO_BUSID_LEN];
          agoq_topo_fmt_busid(busid, pci->attr->pcidev.domain, pci->attr->pcidev.bus, pci->attr->pcidev.dev,
                              pci->attr->pcidev.func);
          if (strcmp(c->pci.busid, busid) != 0) continue;
          /* hwloc's "Port" of an IP interface (when present) names its IB port. */
          if (want_port > 0 && c->port != want_port) continue;
          owner = c;
          break;
        }
        if (owner == NULL) {
          owner = agoq_topo_add_nic(t, h, o);
          if (owner == NULL) return;
          owner->kind = AGOQ_TOPO_NIC_NET;
          agoq_topo_strlcpy(owner->name, sizeof owner->name, o->name);
        }
        agoq_topo_strlcpy(owner->netdev, sizeof owner->netdev, o->name);
      }
    }
  }
}

static bool agoq_topo_is_gpu(unsigned class_id, unsigned vendor) {
  /* Display controllers (VGA 0300, 3D 0302) of GPU vendors; a BMC's VGA (ASPEED 1a03,
   * Matrox 102b) is not a GPU. */
  return (class_id >> 8) == 0x03 && (vendor == 0x10de || vendor == 0x1002);
}

static int agoq_topo_from_hwloc(agoq_topo* t, const agoq_topo_hwloc_api* h, hwloc_topology_t topo) {
  unsigned n = h->get_nbobjs_by_depth(topo, HWLOC_TYPE_DEPTH_NUMANODE);
  for (unsigned i = 0; i < n && t->nnuma < AGOQ_TOPO_MAX_NUMA; i++) {
    hwloc_obj_t o = h->get_obj_by_depth(topo, HWLOC_TYPE_DEPTH_NUMANODE, i);
    if (o == NULL) continue;
    agoq_topo_numa* node = &t->numa[t->nnuma++];
    node->os_index = (int)o->os_index;
    agoq_topo_bitmap_to_cpuset(h, o->cpuset, &node->cpus);
    node->memory_bytes = o->attr != NULL ? o->attr->numanode.local_memory : 0;
  }
  n = h->get_nbobjs_by_depth(topo, HWLOC_TYPE_DEPTH_PCI_DEVICE);
  for (unsigned i = 0; i < n && t->ngpus < AGOQ_TOPO_MAX_GPUS; i++) {
    hwloc_obj_t o = h->get_obj_by_depth(topo, HWLOC_TYPE_DEPTH_PCI_DEVICE, i);
    if (o == NULL || !agoq_topo_is_gpu(o->attr->pcidev.class_id, o->attr->pcidev.vendor_id)) continue;
    agoq_topo_gpu* gpu = &t->gpus[t->ngpus++];
    agoq_topo_fill_pci(h, o, &gpu->pci);
    gpu->vendor = o->attr->pcidev.vendor_id;
    gpu->device = o->attr->pcidev.device_id;
    gpu->class_id = o->attr->pcidev.class_id;
    gpu->cuda = -1;
  }
  agoq_topo_walk_nics(t, h, topo);
  return AGOQ_TOPO_OK;
}

/* Every load starts the same way: I/O objects kept (hwloc 2.x drops them by default, even
 * from XML that has them). */
static int agoq_topo_hwloc_open(const agoq_topo_hwloc_api* h, hwloc_topology_t* topo) {
  if (h->topology_init(topo) != 0) return AGOQ_TOPO_ENOMEM;
  if (h->topology_set_io_types_filter(*topo, HWLOC_TYPE_FILTER_KEEP_ALL) != 0) {
    h->topology_destroy(*topo);
    return AGOQ_TOPO_ELOAD;
  }
  return AGOQ_TOPO_OK;
}

/* Loads and converts; `xml` says the topology must not be this machine. */
static int agoq_topo_hwloc_finish(const agoq_topo_hwloc_api* h, hwloc_topology_t topo, bool xml, agoq_topo* t) {
  int rc = AGOQ_TOPO_OK;
  if (h->topology_load(topo) != 0) {
    rc = xml ? AGOQ_TOPO_EINVAL : AGOQ_TOPO_ELOAD;
    goto out;
  }
  /* hwloc quietly loads this machine when an XML source fails: never report that as the
   * file's content. An XML without a single PU is no topology either. */
  int pu_depth = h->get_type_depth(topo, HWLOC_OBJ_PU);
  if ((xml && h->topology_is_thissystem(topo)) || pu_depth < 0 || h->get_nbobjs_by_depth(topo, pu_depth) == 0) {
    rc = xml ? AGOQ_TOPO_EINVAL : AGOQ_TOPO_ELOAD;
    goto out;
  }
  memset(t, 0, sizeof *t);
  t->this_system = !xml;
  agoq_topo_strlcpy(t->source, sizeof t->source, xml ? "hwloc-xml" : "hwloc");
  rc = agoq_topo_from_hwloc(t, h, topo);
  if (rc == AGOQ_TOPO_OK) agoq_topo_finalize(t);
out:
  h->topology_destroy(topo);
  return rc;
}

int agoq_topo_discover_hwloc(agoq_topo* t) {
  const agoq_topo_hwloc_api* h = agoq_topo_hwloc_api_get(NULL, 0);
  if (h == NULL) return AGOQ_TOPO_ENOHWLOC;
  hwloc_topology_t topo;
  int rc = agoq_topo_hwloc_open(h, &topo);
  if (rc != AGOQ_TOPO_OK) return rc;
  /* libpciaccess (hwloc's "pci" component) adds nothing the Linux backend's sysfs scan
   * does not find, is slow, and leaks under ASan; leave it out when hwloc lets us. */
  if (h->topology_set_components != NULL) h->topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci");
  return agoq_topo_hwloc_finish(h, topo, false, t);
}

int agoq_topo_load_xml(const char* path, agoq_topo* t) {
  if (path == NULL || t == NULL) return AGOQ_TOPO_EINVAL;
  FILE* f = fopen(path, "r");
  if (f == NULL) return AGOQ_TOPO_ENOENT;
  fclose(f);
  const agoq_topo_hwloc_api* h = agoq_topo_hwloc_api_get(NULL, 0);
  if (h == NULL) return AGOQ_TOPO_ENOHWLOC;
  hwloc_topology_t topo;
  int rc = agoq_topo_hwloc_open(h, &topo);
  if (rc != AGOQ_TOPO_OK) return rc;
  if (h->topology_set_xml(topo, path) != 0) {
    rc = errno == ENOENT ? AGOQ_TOPO_ENOENT : AGOQ_TOPO_EINVAL;
    h->topology_destroy(topo);
    return rc;
  }
  return agoq_topo_hwloc_finish(h, topo, true, t);
}

int agoq_topo_load_xml_buffer(const char* buf, int len, agoq_topo* t) {
  if (buf == NULL || len <= 0 || t == NULL) return AGOQ_TOPO_EINVAL;
  const agoq_topo_hwloc_api* h = agoq_topo_hwloc_api_get(NULL, 0);
  if (h == NULL) return AGOQ_TOPO_ENOHWLOC;
  hwloc_topology_t topo;
  int rc = agoq_topo_hwloc_open(h, &topo);
  if (rc != AGOQ_TOPO_OK) return rc;
  if (h->topology_set_xmlbuffer(topo, buf, len) != 0) {
    h->topology_destroy(topo);
    return AGOQ_TOPO_EINVAL;
  }
  return agoq_topo_hwloc_finish(h, topo, true, t);
}
