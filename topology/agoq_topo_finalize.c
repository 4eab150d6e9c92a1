/* What every discovery back end does last, and the choice between them. */
#include <stdlib.h>
#include <string.h>

#include "agoq_topo_internal.h"

void agoq_topo_strlcpy(char* dst, size_t n, const char* src) {
  if (n == 0) return;
  size_t len = strnlen(src, n - 1);
  memcpy(dst, src, len);
  dst[len] = '\0';
}

bool agoq_topo_is_busid(const char* s, size_t len) {
  static const char shape[] = "xxxx:xx:xx.x";
  if (len != sizeof shape - 1) return false;
  for (size_t i = 0; i < len; i++) {
    bool hex = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f') || (s[i] >= 'A' && s[i] <= 'F');
    if (shape[i] == 'x' ? !hex : s[i] != shape[i]) return false;
  }
  return true;
}

bool agoq_topo_parse_sysfs_path(const char* path, agoq_topo_pci* p) {
  memset(p, 0, sizeof *p);
  p->numa = -1;
  const char* s = strstr(path, "/devices/pci");
  if (s == NULL) return false;
  s += strlen("/devices/");
  unsigned domain, bus;
  if (sscanf(s, "pci%x:%x", &domain, &bus) != 2) return false;
  p->domain = domain;
  p->root_bus = bus;
  char comps[AGOQ_TOPO_MAX_DEPTH + 1][AGOQ_TOPO_BUSID_LEN];
  int n = 0;
  const char* c = strchr(s, '/');
  while (c != NULL) {
    c++;
    const char* end = strchr(c, '/');
    size_t len = end ? (size_t)(end - c) : strlen(c);
    /* Stop at the first level that is not a PCI function (virtio2, net, ...). */
    if (!agoq_topo_is_busid(c, len) || n > AGOQ_TOPO_MAX_DEPTH) break;
    memcpy(comps[n], c, len);
    comps[n][len] = '\0';
    n++;
    c = end;
  }
  if (n == 0) return false;
  memcpy(p->busid, comps[n - 1], AGOQ_TOPO_BUSID_LEN);
  p->nbridges = n - 1;
  for (int i = 0; i < n - 1; i++) memcpy(p->bridges[i], comps[i], AGOQ_TOPO_BUSID_LEN);
  return true;
}

static int agoq_topo_cmp_gpu(const void* a, const void* b) {
  return strcmp(((const agoq_topo_gpu*)a)->pci.busid, ((const agoq_topo_gpu*)b)->pci.busid);
}

static int agoq_topo_cmp_nic(const void* pa, const void* pb) {
  const agoq_topo_nic *a = pa, *b = pb;
  if (a->has_pci != b->has_pci) return a->has_pci ? -1 : 1; /* PCI NICs first */
  int c = a->has_pci ? strcmp(a->pci.busid, b->pci.busid) : 0;
  if (c != 0) return c;
  if (a->port != b->port) return a->port < b->port ? -1 : 1;
  return strcmp(a->name, b->name);
}

static int agoq_topo_cmp_numa(const void* a, const void* b) {
  int x = ((const agoq_topo_numa*)a)->os_index, y = ((const agoq_topo_numa*)b)->os_index;
  return (x > y) - (x < y);
}

static int agoq_topo_read_first_int(const char* path) {
  FILE* f = fopen(path, "r");
  if (f == NULL) return -1;
  int v = -1;
  if (fscanf(f, "%d", &v) != 1) v = -1;
  fclose(f);
  return v;
}

void agoq_topo_finalize(agoq_topo* t) {
  qsort(t->gpus, (size_t)t->ngpus, sizeof t->gpus[0], agoq_topo_cmp_gpu);
  qsort(t->nics, (size_t)t->nnics, sizeof t->nics[0], agoq_topo_cmp_nic);
  qsort(t->numa, (size_t)t->nnuma, sizeof t->numa[0], agoq_topo_cmp_numa);
  if (t->nnuma == 1) {
    /* Linux reports numa_node -1 when the machine has one node: the device is local to it. */
    for (int g = 0; g < t->ngpus; g++)
      if (t->gpus[g].pci.numa < 0) t->gpus[g].pci.numa = t->numa[0].os_index;
    for (int k = 0; k < t->nnics; k++)
      if (t->nics[k].has_pci && t->nics[k].pci.numa < 0) t->nics[k].pci.numa = t->numa[0].os_index;
  }
  for (int k = 0; k < t->nnics; k++) {
    agoq_topo_nic* nic = &t->nics[k];
    if (nic->has_pci && nic->pci_path[0] == '\0') {
      char* real = NULL;
      if (t->this_system) {
        /* The kernel's own path: authoritative where our bridge walk could differ. */
        char link[64];
        snprintf(link, sizeof link, "/sys/bus/pci/devices/%s", nic->pci.busid);
        real = realpath(link, NULL);
      }
      if (real != NULL && strlen(real) < sizeof nic->pci_path) strcpy(nic->pci_path, real);
      else agoq_topo_pci_sysfs_path(&nic->pci, nic->pci_path, sizeof nic->pci_path);
      free(real);
    }
    if (!t->this_system || nic->speed_mbps > 0) continue;
    char path[PATH_MAX];
    int v = -1;
    if (nic->kind == AGOQ_TOPO_NIC_IB && nic->ibdev[0] != '\0') {
      /* "400 Gb/sec (4X NDR)" */
      snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d/rate", nic->ibdev, nic->port);
      v = agoq_topo_read_first_int(path);
      if (v > 0) v *= 1000;
    } else if (nic->netdev[0] != '\0') {
      snprintf(path, sizeof path, "/sys/class/net/%s/speed", nic->netdev);
      v = agoq_topo_read_first_int(path);
    }
    nic->speed_mbps = v > 0 ? v : -1;
  }
}

int agoq_topo_discover(agoq_topo* t, bool* used_fallback) {
  int rc = agoq_topo_discover_hwloc(t);
  if (used_fallback != NULL) *used_fallback = rc != AGOQ_TOPO_OK;
  if (rc == AGOQ_TOPO_OK) return rc;
  return agoq_topo_discover_sysfs("/sys", t);
}
