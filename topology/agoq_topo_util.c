/* Small helpers shared by discovery and output: cpulists, sysfs paths, error text. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_topo.h"

const char* agoq_topo_strerror(int rc) {
  switch (rc) {
    case AGOQ_TOPO_OK: return "success";
    case AGOQ_TOPO_ENOHWLOC: return "hwloc is not available";
    case AGOQ_TOPO_ENOENT: return "file not found or not readable";
    case AGOQ_TOPO_EINVAL: return "not a valid hwloc XML topology";
    case AGOQ_TOPO_ELOAD: return "hwloc could not load the topology";
    case AGOQ_TOPO_ENOMEM: return "out of memory";
    case AGOQ_TOPO_ENOSYSFS: return "not a sysfs tree (neither class/net nor bus/pci below it)";
  }
  return "unknown error";
}

const char* agoq_topo_cpulist(const cpu_set_t* set, char* buf, size_t len) {
  size_t used = 0;
  if (len == 0) return buf;
  buf[0] = '\0';
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, set)) continue;
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, set)) last++;
    char one[32];
    int n = last == cpu ? snprintf(one, sizeof one, "%s%d", used ? "," : "", cpu)
                        : snprintf(one, sizeof one, "%s%d-%d", used ? "," : "", cpu, last);
    if (used + (size_t)n + 1 > len) break; /* truncated at a whole range, never mid-number */
    memcpy(buf + used, one, (size_t)n + 1);
    used += (size_t)n;
    cpu = last;
  }
  return buf;
}

int agoq_topo_cpulist_parse(const char* text, cpu_set_t* set) {
  CPU_ZERO(set);
  const char* p = text;
  while (isspace((unsigned char)*p)) p++;
  while (*p != '\0' && *p != '\n') {
    char* end;
    if (!isdigit((unsigned char)*p)) return -1;
    long lo = strtol(p, &end, 10), hi = lo;
    p = end;
    if (*p == '-') {
      p++;
      if (!isdigit((unsigned char)*p)) return -1;
      hi = strtol(p, &end, 10);
      p = end;
    }
    if (lo < 0 || hi < lo || hi >= CPU_SETSIZE) return -1;
    for (long c = lo; c <= hi; c++) CPU_SET((int)c, set);
    if (*p == ',') p++;
    else if (*p != '\0' && *p != '\n') return -1;
  }
  return 0;
}

void agoq_topo_pci_sysfs_path(const agoq_topo_pci* p, char* buf, size_t len) {
  int n = snprintf(buf, len, "/sys/devices/pci%04x:%02x", p->domain, p->root_bus);
  for (int i = 0; i < p->nbridges && n > 0 && (size_t)n < len; i++) n += snprintf(buf + n, len - (size_t)n, "/%s", p->bridges[i]);
  if (n > 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, "/%s", p->busid);
}

int agoq_topo_numa_find(const agoq_topo* t, int os_index) {
  for (int i = 0; i < t->nnuma; i++)
    if (t->numa[i].os_index == os_index) return i;
  return -1;
}

bool agoq_topo_placement_cpus(const agoq_topo* t, int os_index, const cpu_set_t* allowed, cpu_set_t* out) {
  CPU_ZERO(out);
  int i = agoq_topo_numa_find(t, os_index);
  if (i < 0) return false;
  CPU_AND(out, &t->numa[i].cpus, allowed);
  return CPU_COUNT(out) > 0;
}
