/*
 * The fallback when hwloc cannot be loaded: the same facts read straight from sysfs.
 * NUMA nodes from devices/system/node, GPUs from bus/pci/devices (class and vendor), NICs
 * from class/infiniband (one per port) and class/net (interfaces backed by a device);
 * the PCI bridges of each device are the directories of its real sysfs path.
 */
#include <dirent.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "agoq_topo_internal.h"

static int agoq_topo_read_line(const char* path, char* buf, size_t len) {
  FILE* f = fopen(path, "r");
  if (f == NULL) return -1;
  char* ok = fgets(buf, (int)len, f);
  fclose(f);
  if (ok == NULL) return -1;
  buf[strcspn(buf, "\n")] = '\0';
  return 0;
}

static long agoq_topo_read_long(const char* path, int base, long dflt) {
  char line[64];
  if (agoq_topo_read_line(path, line, sizeof line) != 0) return dflt;
  char* end;
  long v = strtol(line, &end, base);
  return end == line ? dflt : v;
}

static void agoq_topo_sysfs_numa(const char* root, agoq_topo* t) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/devices/system/node", root);
  DIR* d = opendir(path);
  if (d == NULL) return;
  struct dirent* e;
  while ((e = readdir(d)) != NULL && t->nnuma < AGOQ_TOPO_MAX_NUMA) {
    int idx;
    char tail;
    if (sscanf(e->d_name, "node%d%c", &idx, &tail) != 1 || idx < 0) continue;
    char line[AGOQ_TOPO_CPUS_LEN * 4];
    snprintf(path, sizeof path, "%s/devices/system/node/%s/cpulist", root, e->d_name);
    agoq_topo_numa* node = &t->numa[t->nnuma];
    memset(node, 0, sizeof *node);
    node->os_index = idx;
    if (agoq_topo_read_line(path, line, sizeof line) == 0) agoq_topo_cpulist_parse(line, &node->cpus);
    snprintf(path, sizeof path, "%s/devices/system/node/%s/meminfo", root, e->d_name);
    FILE* f = fopen(path, "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
      char* m = strstr(line, "MemTotal:");
      if (m != NULL) node->memory_bytes = strtoull(m + strlen("MemTotal:"), NULL, 10) * 1024u;
    }
    if (f != NULL) fclose(f);
    t->nnuma++;
  }
  closedir(d);
}

/* The PCI device behind `link` (a sysfs symlink): location, real path cut after the last
 * PCI address, NUMA node. */
static bool agoq_topo_sysfs_pci(const char* link, agoq_topo_pci* p, char* real_out, size_t len) {
  char* real = realpath(link, NULL);
  if (real == NULL) return false;
  bool ok = agoq_topo_parse_sysfs_path(real, p);
  if (ok) {
    char* at = strstr(real, p->busid);
    while (at != NULL && strstr(at + 1, p->busid) != NULL) at = strstr(at + 1, p->busid);
    if (at != NULL) at[strlen(p->busid)] = '\0';
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/numa_node", real);
    p->numa = (int)agoq_topo_read_long(path, 10, -1);
    if (real_out != NULL && strlen(real) < len) strcpy(real_out, real);
  }
  free(real);
  return ok;
}

static void agoq_topo_sysfs_gpus(const char* root, agoq_topo* t) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/bus/pci/devices", root);
  DIR* d = opendir(path);
  if (d == NULL) return;
  struct dirent* e;
  while ((e = readdir(d)) != NULL && t->ngpus < AGOQ_TOPO_MAX_GPUS) {
    if (!agoq_topo_is_busid(e->d_name, strlen(e->d_name))) continue;
    snprintf(path, sizeof path, "%s/bus/pci/devices/%s/class", root, e->d_name);
    long cls = agoq_topo_read_long(path, 16, 0) >> 8; /* 0x030200 -> 0x0302 */
    snprintf(path, sizeof path, "%s/bus/pci/devices/%s/vendor", root, e->d_name);
    long vendor = agoq_topo_read_long(path, 16, 0);
    if ((cls >> 8) != 0x03 || (vendor != 0x10de && vendor != 0x1002)) continue;
    agoq_topo_gpu* gpu = &t->gpus[t->ngpus];
    snprintf(path, sizeof path, "%s/bus/pci/devices/%s", root, e->d_name);
    if (!agoq_topo_sysfs_pci(path, &gpu->pci, NULL, 0)) continue;
    snprintf(path, sizeof path, "%s/bus/pci/devices/%s/device", root, e->d_name);
    gpu->vendor = (uint16_t)vendor;
    gpu->device = (uint16_t)agoq_topo_read_long(path, 16, 0);
    gpu->class_id = (uint16_t)cls;
    gpu->cuda = -1;
    t->ngpus++;
  }
  closedir(d);
}

static agoq_topo_nic* agoq_topo_sysfs_new_nic(agoq_topo* t) {
  if (t->nnics >= AGOQ_TOPO_MAX_NICS) return NULL;
  agoq_topo_nic* nic = &t->nics[t->nnics++];
  memset(nic, 0, sizeof *nic);
  nic->speed_mbps = -1;
  nic->pci.numa = -1;
  return nic;
}

static void agoq_topo_sysfs_ib(const char* root, agoq_topo* t) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/class/infiniband", root);
  DIR* d = opendir(path);
  if (d == NULL) return;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || strlen(e->d_name) >= AGOQ_TOPO_NAME_LEN - 4) continue;
    int ports = 0;
    snprintf(path, sizeof path, "%s/class/infiniband/%s/ports", root, e->d_name);
    DIR* pd = opendir(path);
    struct dirent* pe;
    while (pd != NULL && (pe = readdir(pd)) != NULL) {
      int n = atoi(pe->d_name);
      if (n > ports) ports = n;
    }
    if (pd != NULL) closedir(pd);
    char guid[64] = "";
    snprintf(path, sizeof path, "%s/class/infiniband/%s/node_guid", root, e->d_name);
    agoq_topo_read_line(path, guid, sizeof guid);
    uint64_t g = 0;
    for (const char* c = guid; *c != '\0'; c++) {
      if (*c == ':') continue;
      char digit[2] = {*c, '\0'};
      g = g << 4 | (uint64_t)strtoul(digit, NULL, 16);
    }
    for (int port = 1; port <= (ports > 0 ? ports : 1); port++) {
      agoq_topo_nic* nic = agoq_topo_sysfs_new_nic(t);
      if (nic == NULL) break;
      nic->kind = AGOQ_TOPO_NIC_IB;
      nic->port = port;
      nic->guid = g;
      agoq_topo_strlcpy(nic->ibdev, sizeof nic->ibdev, e->d_name);
      if (ports > 1) snprintf(nic->name, sizeof nic->name, "%.48s:%d", e->d_name, port);
      else agoq_topo_strlcpy(nic->name, sizeof nic->name, e->d_name);
      snprintf(path, sizeof path, "%s/class/infiniband/%s/device", root, e->d_name);
      nic->has_pci = agoq_topo_sysfs_pci(path, &nic->pci, nic->pci_path, sizeof nic->pci_path);
      snprintf(path, sizeof path, "%s/class/infiniband/%s/ports/%d/rate", root, e->d_name, port);
      long rate = agoq_topo_read_long(path, 10, -1);
      nic->speed_mbps = rate > 0 ? (int)rate * 1000 : -1;
    }
  }
  closedir(d);
}

static void agoq_topo_sysfs_net(const char* root, agoq_topo* t) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/class/net", root);
  DIR* d = opendir(path);
  if (d == NULL) return;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || strlen(e->d_name) > IF_NAMESIZE) continue;
    agoq_topo_pci pci;
    char real[PATH_MAX] = "";
    snprintf(path, sizeof path, "%s/class/net/%s/device", root, e->d_name);
    /* Interfaces without a device behind them (lo, bridges, veth, ifb) are not NICs. */
    if (!agoq_topo_sysfs_pci(path, &pci, real, sizeof real)) continue;
    snprintf(path, sizeof path, "%s/class/net/%s/dev_port", root, e->d_name);
    int want_port = (int)agoq_topo_read_long(path, 10, -1) + 1;
    agoq_topo_nic* owner = NULL;
    for (int k = 0; k < t->nnics && owner == NULL; k++) {
      agoq_topo_nic* c = &t->nics[k];
      if (c->kind == AGOQ_TOPO_NIC_IB && c->has_pci && c->netdev[0] == '\0' && strcmp(c->pci.busid, pci.busid) == 0 &&
          (want_port <= 0 || c->port == want_port || c->port == 1))
        owner = c;
    }
    if (owner == NULL) {
      owner = agoq_topo_sysfs_new_nic(t);
      if (owner == NULL) break;
      owner->kind = AGOQ_TOPO_NIC_NET;
      owner->has_pci = true;
      owner->pci = pci;
      agoq_topo_strlcpy(owner->pci_path, sizeof owner->pci_path, real);
      agoq_topo_strlcpy(owner->name, sizeof owner->name, e->d_name);
      snprintf(path, sizeof path, "%s/class/net/%s/speed", root, e->d_name);
      long speed = agoq_topo_read_long(path, 10, -1);
      owner->speed_mbps = speed > 0 ? (int)speed : -1;
    }
    agoq_topo_strlcpy(owner->netdev, sizeof owner->netdev, e->d_name);
  }
  closedir(d);
}

int agoq_topo_discover_sysfs(const char* sysfs_root, agoq_topo* t) {
  if (sysfs_root == NULL || t == NULL) return AGOQ_TOPO_EINVAL;
  memset(t, 0, sizeof *t);
  /* Every Linux sysfs has class/net (lo at least) and, with PCI, bus/pci: a root with
   * neither is a wrong directory, not a machine without devices. */
  static const char* const expected[] = {"class/net", "bus/pci"};
  bool found = false;
  for (size_t i = 0; i < sizeof expected / sizeof expected[0] && !found; i++) {
    char path[PATH_MAX];
    struct stat st;
    int n = snprintf(path, sizeof path, "%s/%s", sysfs_root, expected[i]);
    found = n > 0 && (size_t)n < sizeof path && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
  }
  if (!found) return AGOQ_TOPO_ENOSYSFS;
  snprintf(t->source, sizeof t->source, "sysfs");
  /* Only the real /sys describes this machine; a test tree must not be mixed with it. */
  t->this_system = strcmp(sysfs_root, "/sys") == 0;
  agoq_topo_sysfs_numa(sysfs_root, t);
  agoq_topo_sysfs_gpus(sysfs_root, t);
  agoq_topo_sysfs_ib(sysfs_root, t);
  agoq_topo_sysfs_net(sysfs_root, t);
  agoq_topo_finalize(t);
  return AGOQ_TOPO_OK;
}
