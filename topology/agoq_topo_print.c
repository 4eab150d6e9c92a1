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

/* ---- NVLink and the nvidia-smi style matrix (only once NVML was asked) ---------------- */

static bool agoq_topo_same_host_bridge(const agoq_topo_pci* a, const agoq_topo_pci* b) {
  return a->domain == b->domain && a->root_bus == b->root_bus;
}

/* A PCI class in nvidia-smi's words. nvidia-smi splits what NCCL calls PHB into PHB (one
 * host bridge) and NODE (several host bridges of one NUMA node). */
static const char* agoq_topo_smi_pci(agoq_topo_path_type type, const agoq_topo_pci* a, const agoq_topo_pci* b) {
  switch (type) {
    case AGOQ_TOPO_PATH_LOC: return "X";
    case AGOQ_TOPO_PATH_NVL: return "NVL";
    case AGOQ_TOPO_PATH_PHB: return b != NULL && agoq_topo_same_host_bridge(a, b) ? "PHB" : "NODE";
    default: return agoq_topo_path_name(type);
  }
}

const char* agoq_topo_smi_gpu_gpu(const agoq_topo* t, int a, int b, char* buf, size_t len) {
  int links = agoq_topo_gpu_nvlinks(t, a, b);
  if (a == b) snprintf(buf, len, "X");
  else if (links > 0) snprintf(buf, len, "NV%d", links);
  else
    snprintf(buf, len, "%s",
             agoq_topo_smi_pci(agoq_topo_pci_path(&t->gpus[a].pci, &t->gpus[b].pci, NULL), &t->gpus[a].pci,
                               &t->gpus[b].pci));
  return buf;
}

const char* agoq_topo_smi_gpu_nic(const agoq_topo* t, int g, int n, char* buf, size_t len) {
  const agoq_topo_gpu* gpu = &t->gpus[g];
  const agoq_topo_nic* nic = &t->nics[n];
  int links = 0;
  for (int l = 0; l < gpu->nvlinks && nic->has_pci; l++)
    if (gpu->nvlink[l].busid[0] != '\0' && agoq_topo_busid_equal(gpu->nvlink[l].busid, nic->pci.busid)) links++;
  if (links > 0) snprintf(buf, len, "NV%d", links);
  else
    snprintf(buf, len, "%s",
             agoq_topo_smi_pci(agoq_topo_gpu_nic_direct(t, g, n, NULL), &gpu->pci, nic->has_pci ? &nic->pci : NULL));
  return buf;
}

/* One far end of some of a GPU's links. */
typedef struct {
  agoq_topo_nvl_remote remote;
  const char* busid;
  int gpu;
  int links;
} agoq_topo_nvl_group;

/* The GPU's links grouped by far end, in link order; `merge_switches` folds all NVSwitches
 * into one group (the text output: which switch a link goes to says little to people). */
static int agoq_topo_nvl_groups(const agoq_topo_gpu* gpu, bool merge_switches,
                                agoq_topo_nvl_group groups[AGOQ_TOPO_NVLINK_MAX]) {
  int n = 0;
  for (int l = 0; l < gpu->nvlinks; l++) {
    const agoq_topo_nvlink* link = &gpu->nvlink[l];
    int i = 0;
    for (; i < n; i++) {
      if (groups[i].remote != link->remote) continue;
      if ((merge_switches && link->remote == AGOQ_TOPO_NVL_SWITCH) || strcmp(groups[i].busid, link->busid) == 0) break;
    }
    if (i == n) groups[n++] = (agoq_topo_nvl_group){link->remote, link->busid, link->gpu, 0};
    groups[i].links++;
  }
  return n;
}

static void agoq_topo_text_nvlink(FILE* out, const agoq_topo* t, const agoq_topo_gpu* gpu) {
  if (t->nvml_state != AGOQ_TOPO_NVML_LOADED) {
    fprintf(out, ", NVLink unknown (%s)", t->nvml_why);
    return;
  }
  if (!gpu->nvml) {
    fputs(", NVLink unknown (NVML does not know this GPU)", out);
    return;
  }
  fprintf(out, ", NVLink %d active", gpu->nvlinks);
  agoq_topo_nvl_group groups[AGOQ_TOPO_NVLINK_MAX];
  int n = agoq_topo_nvl_groups(gpu, true, groups);
  for (int i = 0; i < n; i++) {
    fputs(i == 0 ? " (" : ", ", out);
    switch (groups[i].remote) {
      case AGOQ_TOPO_NVL_SWITCH: fputs("NVSwitch", out); break;
      case AGOQ_TOPO_NVL_GPU:
        if (groups[i].gpu >= 0) fprintf(out, "GPU%d", groups[i].gpu);
        else fprintf(out, "GPU %s", groups[i].busid[0] != '\0' ? groups[i].busid : "?");
        break;
      case AGOQ_TOPO_NVL_CPU: fprintf(out, "CPU %s", groups[i].busid[0] != '\0' ? groups[i].busid : "?"); break;
      case AGOQ_TOPO_NVL_UNKNOWN: fputs("unknown", out); break;
    }
    fprintf(out, " x%d", groups[i].links);
  }
  fprintf(out, "%s, NVSwitch %s", n > 0 ? ")" : "", gpu->nvswitch ? "yes" : "no");
}

static void agoq_topo_json_nvlink(FILE* out, const agoq_topo* t, const agoq_topo_gpu* gpu) {
  if (t->nvml_state != AGOQ_TOPO_NVML_LOADED || !gpu->nvml) {
    fputs("{\"known\": false, \"reason\": ", out);
    agoq_topo_json_str(out, t->nvml_state != AGOQ_TOPO_NVML_LOADED ? t->nvml_why : "NVML does not know this GPU");
    fputc('}', out);
    return;
  }
  fprintf(out, "{\"known\": true, \"active\": %d, \"nvswitch\": %s, \"remotes\": [", gpu->nvlinks,
          gpu->nvswitch ? "true" : "false");
  agoq_topo_nvl_group groups[AGOQ_TOPO_NVLINK_MAX];
  int n = agoq_topo_nvl_groups(gpu, false, groups);
  for (int i = 0; i < n; i++) {
    fprintf(out, "%s{\"type\": \"%s\", \"busid\": ", i ? ", " : "", agoq_topo_nvl_remote_name(groups[i].remote));
    if (groups[i].busid[0] != '\0') agoq_topo_json_str(out, groups[i].busid);
    else fputs("null", out);
    fputs(", \"gpu\": ", out);
    if (groups[i].gpu >= 0) fprintf(out, "%d", groups[i].gpu);
    else fputs("null", out);
    fprintf(out, ", \"links\": %d}", groups[i].links);
  }
  fputs("]}", out);
}

/* The GPU x (GPU, NIC) matrix the way nvidia-smi topo -m prints it, with a legend. */
static void agoq_topo_text_smi(FILE* out, const agoq_topo* t) {
  char cell[16], label[16];
  int width = 4;
  for (int k = 0; k < t->nnics; k++) {
    int len = (int)strlen(t->nics[k].name);
    if (len > width) width = len;
  }
  for (int g = 0; g < t->ngpus; g++) {
    int len = snprintf(label, sizeof label, "GPU%d", g);
    if (len > width) width = len;
    for (int b = 0; b < t->ngpus; b++) {
      len = (int)strlen(agoq_topo_smi_gpu_gpu(t, g, b, cell, sizeof cell));
      if (len > width) width = len;
    }
  }
  int cols = t->ngpus + t->nnics;
  fprintf(out, "\nGPU topology (nvidia-smi topo -m terms):\n  %-6s", "");
  for (int c = 0; c < cols; c++) {
    if (c < t->ngpus) snprintf(label, sizeof label, "GPU%d", c);
    fprintf(out, " %-*s", c + 1 < cols ? width : 0, c < t->ngpus ? label : t->nics[c - t->ngpus].name);
  }
  fputc('\n', out);
  for (int g = 0; g < t->ngpus; g++) {
    snprintf(label, sizeof label, "GPU%d", g);
    fprintf(out, "  %-6s", label);
    for (int c = 0; c < cols; c++) {
      if (c < t->ngpus) agoq_topo_smi_gpu_gpu(t, g, c, cell, sizeof cell);
      else agoq_topo_smi_gpu_nic(t, g, c - t->ngpus, cell, sizeof cell);
      fprintf(out, " %-*s", c + 1 < cols ? width : 0, cell);
    }
    fputc('\n', out);
  }
  fputs("  X = self, NV# = # NVLinks (direct, or through NVSwitches: the smaller switch-link count),\n"
        "  PIX = one PCIe switch, PXB = several PCIe switches, PHB = one PCIe host bridge,\n"
        "  NODE = host bridges within one NUMA node, SYS = across NUMA nodes (PCI classes by NCCL's rules)\n",
        out);
}

static void agoq_topo_json_smi(FILE* out, const agoq_topo* t) {
  char cell[16];
  fputs(",\n  \"nvml\": {\"loaded\": ", out);
  fputs(t->nvml_state == AGOQ_TOPO_NVML_LOADED ? "true, \"reason\": null}" : "false, \"reason\": ", out);
  if (t->nvml_state != AGOQ_TOPO_NVML_LOADED) {
    agoq_topo_json_str(out, t->nvml_why);
    fputc('}', out);
  }
  for (int part = 0; part < 2; part++) {
    int cols = part == 0 ? t->ngpus : t->nnics;
    fputs(part == 0 ? ",\n  \"smi_matrix\": {\"gpus\": [" : "],\n    \"nics\": [", out);
    for (int g = 0; g < t->ngpus; g++) {
      fprintf(out, "%s\n      [", g ? "," : "");
      for (int c = 0; c < cols; c++) {
        if (part == 0) agoq_topo_smi_gpu_gpu(t, g, c, cell, sizeof cell);
        else agoq_topo_smi_gpu_nic(t, g, c, cell, sizeof cell);
        fprintf(out, "%s\"%s\"", c ? ", " : "", cell);
      }
      fputc(']', out);
    }
  }
  fputs("]}", out);
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
    if (t->nvml_state != AGOQ_TOPO_NVML_NOT_ASKED) {
      fputs(", \"via_gpu\": ", out);
      if (c->via[g] >= 0) fprintf(out, "%d", c->via[g]);
      else fputs("null", out);
      fputs(", \"nvlink\": ", out);
      agoq_topo_json_nvlink(out, t, gpu);
    }
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
  fputs(t->ngpus ? "\n  ]" : "]", out);
  if (t->nvml_state != AGOQ_TOPO_NVML_NOT_ASKED) agoq_topo_json_smi(out, t);
  fputs("\n}\n", out);
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
    if (t->nvml_state != AGOQ_TOPO_NVML_NOT_ASKED) agoq_topo_text_nvlink(out, t, &t->gpus[g]);
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
  if (t->nvml_state != AGOQ_TOPO_NVML_NOT_ASKED) agoq_topo_text_smi(out, t);
  fprintf(out, "\nChoice (%s):\n",
          t->nnics == 0 ? "no NIC" : c->rail_aligned ? "rail-aligned, one NIC per GPU" : "nearest NIC");
  for (int g = 0; g < t->ngpus; g++) {
    fprintf(out, "  GPU%d -> ", g);
    if (c->nic[g] >= 0 && c->via[g] >= 0)
      fprintf(out, "%s (%s via GPU%d)", t->nics[c->nic[g]].name, agoq_topo_path_name(c->path[g]), c->via[g]);
    else if (c->nic[g] >= 0)
      fprintf(out, "%s (%s)", t->nics[c->nic[g]].name, agoq_topo_path_name(c->path[g]));
    else fputs("no NIC", out);
    const char* list = agoq_topo_numa_cpus(t, t->gpus[g].pci.numa, cpus, sizeof cpus);
    fprintf(out, ", cpus %s\n", list[0] != '\0' ? list : "any");
  }
}
