/* agoq-topo's output: a text report for people and JSON for scripts and golden tests.
 * Both are deterministic for a given topology (no addresses, times or host names). */
#include <inttypes.h>
#include <string.h>

#include "agoq_topo.h"

static const char* agoq_topo_nic_kind_name(agoq_topo_nic_kind k) { return k == AGOQ_TOPO_NIC_IB ? "ib" : "net"; }

/* Names come from hwloc XML, which anyone can write: escape everything JSON requires. */
static void agoq_topo_json_str(FILE* out, const char* s) {
  fputc('"', out);
  for (const unsigned char* p = (const unsigned char*)s; *p != '\0'; p++) {
    if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
    else if (*p < 0x20 || *p >= 0x7f) fprintf(out, "\\u%04x", *p);
    else fputc(*p, out);
  }
  fputc('"', out);
}

static void agoq_topo_json_numa(FILE* out, int numa) {
  if (numa < 0) fputs("null", out);
  else fprintf(out, "%d", numa);
}

/* CPUs local to NUMA node `numa`, "" when unknown. */
static const char* agoq_topo_numa_cpus(const agoq_topo* t, int numa, char* buf, size_t len) {
  int i = agoq_topo_numa_find(t, numa);
  if (i < 0) {
    buf[0] = '\0';
    return buf;
  }
  return agoq_topo_cpulist(&t->numa[i].cpus, buf, len);
}

void agoq_topo_print_json(FILE* out, const agoq_topo* t, const agoq_topo_choice* c) {
  char cpus[AGOQ_TOPO_CPUS_LEN];
  fputs("{\n  \"source\": ", out);
  agoq_topo_json_str(out, t->source);
  fprintf(out, ",\n  \"rail_aligned\": %s,\n  \"gpus\": [", c->rail_aligned ? "true" : "false");
  for (int g = 0; g < t->ngpus; g++) {
    const agoq_topo_gpu* gpu = &t->gpus[g];
    fprintf(out, "%s\n    {\"index\": %d, \"busid\": ", g ? "," : "", g);
    agoq_topo_json_str(out, gpu->pci.busid);
    fprintf(out, ", \"pciid\": \"%04x:%04x\", \"nic\": ", gpu->vendor, gpu->device);
    if (c->nic[g] >= 0) {
      agoq_topo_json_str(out, t->nics[c->nic[g]].name);
      fprintf(out, ", \"path\": \"%s\"", agoq_topo_path_name(c->path[g]));
    } else {
      fputs("null, \"path\": null", out);
    }
    fputs(", \"cuda\": ", out);
    if (gpu->cuda >= 0) fprintf(out, "%d", gpu->cuda);
    else fputs("null", out);
    fputs(", \"numa\": ", out);
    agoq_topo_json_numa(out, gpu->pci.numa);
    fputs(", \"cpus\": ", out);
    agoq_topo_json_str(out, agoq_topo_numa_cpus(t, gpu->pci.numa, cpus, sizeof cpus));
    fputc('}', out);
  }
  fputs(t->ngpus ? "\n  ],\n  \"nics\": [" : "],\n  \"nics\": [", out);
  for (int k = 0; k < t->nnics; k++) {
    const agoq_topo_nic* nic = &t->nics[k];
    fprintf(out, "%s\n    {\"index\": %d, \"name\": ", k ? "," : "", k);
    agoq_topo_json_str(out, nic->name);
    fprintf(out, ", \"kind\": \"%s\", \"netdev\": ", agoq_topo_nic_kind_name(nic->kind));
    if (nic->netdev[0] != '\0') agoq_topo_json_str(out, nic->netdev);
    else fputs("null", out);
    fputs(", \"busid\": ", out);
    if (nic->has_pci) agoq_topo_json_str(out, nic->pci.busid);
    else fputs("null", out);
    fputs(", \"pciPath\": ", out);
    if (nic->pci_path[0] != '\0') agoq_topo_json_str(out, nic->pci_path);
    else fputs("null", out);
    fputs(", \"numa\": ", out);
    agoq_topo_json_numa(out, nic->has_pci ? nic->pci.numa : -1);
    fprintf(out, ", \"port\": %d, \"guid\": \"0x%016" PRIx64 "\", \"speed_mbps\": ", nic->port, nic->guid);
    if (nic->speed_mbps > 0) fprintf(out, "%d}", nic->speed_mbps);
    else fputs("null}", out);
  }
  fputs(t->nnics ? "\n  ],\n  \"numa\": [" : "],\n  \"numa\": [", out);
  for (int i = 0; i < t->nnuma; i++) {
    fprintf(out, "%s\n    {\"os_index\": %d, \"cpus\": ", i ? "," : "", t->numa[i].os_index);
    agoq_topo_json_str(out, agoq_topo_cpulist(&t->numa[i].cpus, cpus, sizeof cpus));
    fprintf(out, ", \"memory_bytes\": %" PRIu64 "}", t->numa[i].memory_bytes);
  }
  fputs(t->nnuma ? "\n  ],\n  \"matrix\": [" : "],\n  \"matrix\": [", out);
  for (int g = 0; g < t->ngpus; g++) {
    fprintf(out, "%s\n    [", g ? "," : "");
    for (int k = 0; k < t->nnics; k++)
      fprintf(out, "%s\"%s\"", k ? ", " : "", agoq_topo_path_name(agoq_topo_gpu_nic_path(t, g, k, NULL)));
    fputc(']', out);
  }
  fputs(t->ngpus ? "\n  ]\n}\n" : "]\n}\n", out);
}

static void agoq_topo_text_numa(FILE* out, int numa) {
  if (numa < 0) fputs("numa ?", out);
  else fprintf(out, "numa %d", numa);
}

void agoq_topo_print_text(FILE* out, const agoq_topo* t, const agoq_topo_choice* c) {
  char cpus[AGOQ_TOPO_CPUS_LEN];
  fprintf(out, "Topology from %s\n\nNUMA nodes: %d\n", t->source, t->nnuma);
  for (int i = 0; i < t->nnuma; i++)
    fprintf(out, "  node %d: cpus %s, %" PRIu64 " MiB\n", t->numa[i].os_index,
            agoq_topo_cpulist(&t->numa[i].cpus, cpus, sizeof cpus), t->numa[i].memory_bytes >> 20);

  if (t->ngpus == 0) fputs("\nGPUs: none (no GPUs)\n", out);
  else fprintf(out, "\nGPUs: %d\n", t->ngpus);
  for (int g = 0; g < t->ngpus; g++) {
    fprintf(out, "  GPU%d %s [%04x:%04x] ", g, t->gpus[g].pci.busid, t->gpus[g].vendor, t->gpus[g].device);
    if (t->gpus[g].cuda >= 0) fprintf(out, "cuda %d, ", t->gpus[g].cuda);
    agoq_topo_text_numa(out, t->gpus[g].pci.numa);
    fputc('\n', out);
  }

  if (t->nnics == 0) fputs("\nNICs: none\n", out);
  else fprintf(out, "\nNICs: %d\n", t->nnics);
  for (int k = 0; k < t->nnics; k++) {
    const agoq_topo_nic* nic = &t->nics[k];
    fprintf(out, "  %s (%s", nic->name, agoq_topo_nic_kind_name(nic->kind));
    if (nic->netdev[0] != '\0') fprintf(out, ", netdev %s", nic->netdev);
    if (nic->port > 0) fprintf(out, ", port %d", nic->port);
    if (nic->speed_mbps > 0) fprintf(out, ", %d Mb/s", nic->speed_mbps);
    if (nic->guid != 0) fprintf(out, ", guid 0x%016" PRIx64, nic->guid);
    fputs(") ", out);
    if (nic->has_pci) {
      fprintf(out, "%s ", nic->pci.busid);
      agoq_topo_text_numa(out, nic->pci.numa);
    } else {
      fputs("no PCI device", out);
    }
    fputc('\n', out);
    if (nic->pci_path[0] != '\0') fprintf(out, "      pciPath %s\n", nic->pci_path);
  }

  if (t->ngpus == 0) return;
  int width = 4;
  for (int k = 0; k < t->nnics; k++) {
    int len = (int)strlen(t->nics[k].name);
    if (len > width) width = len;
  }
  if (t->nnics > 0) {
    fprintf(out, "\nGPU x NIC paths:\n  %-6s", "");
    for (int k = 0; k < t->nnics; k++) fprintf(out, " %-*s", k + 1 < t->nnics ? width : 0, t->nics[k].name);
    fputc('\n', out);
  }
  for (int g = 0; g < t->ngpus && t->nnics > 0; g++) {
    char label[16];
    snprintf(label, sizeof label, "GPU%d", g);
    fprintf(out, "  %-6s", label);
    for (int k = 0; k < t->nnics; k++)
      fprintf(out, " %-*s", k + 1 < t->nnics ? width : 0, agoq_topo_path_name(agoq_topo_gpu_nic_path(t, g, k, NULL)));
    fputc('\n', out);
  }
  fprintf(out, "\nChoice (%s):\n",
          t->nnics == 0 ? "no NIC" : c->rail_aligned ? "rail-aligned, one NIC per GPU" : "nearest NIC");
  for (int g = 0; g < t->ngpus; g++) {
    fprintf(out, "  GPU%d -> ", g);
    if (c->nic[g] >= 0) fprintf(out, "%s (%s)", t->nics[c->nic[g]].name, agoq_topo_path_name(c->path[g]));
    else fputs("no NIC", out);
    const char* list = agoq_topo_numa_cpus(t, t->gpus[g].pci.numa, cpus, sizeof cpus);
    fprintf(out, ", cpus %s\n", list[0] != '\0' ? list : "any");
  }
}
