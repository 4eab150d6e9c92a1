/*
 * Path types between a GPU and a NIC, as NCCL's topology code computes them, so what
 * agoq-topo prints is what NCCL will decide from the pciPath we report.
 *
 * NCCL builds its PCI tree from the sysfs path of each device, climbing two directory
 * levels at a time: a PCIe switch shows up in sysfs as an upstream port plus a downstream
 * port, and NCCL keeps only the upper one of each pair as "the switch". A parent that is
 * not a PCI address (pci0000:00) is the CPU of the device's NUMA node. Link types:
 * device-switch PIX, switch-switch PXB, anything touching the CPU PHB, CPU-CPU SYS; a
 * path's type is the worst link on it.
 */
#include <string.h>

#include "agoq_topo.h"

static agoq_topo_nvl_hook agoq_topo_nvl_fn;
static void* agoq_topo_nvl_arg;

void agoq_topo_set_nvl_hook(agoq_topo_nvl_hook hook, void* arg) {
  agoq_topo_nvl_fn = hook;
  agoq_topo_nvl_arg = arg;
}

const char* agoq_topo_path_name(agoq_topo_path_type t) {
  switch (t) {
    case AGOQ_TOPO_PATH_LOC: return "LOC";
    case AGOQ_TOPO_PATH_NVL: return "NVL";
    case AGOQ_TOPO_PATH_PIX: return "PIX";
    case AGOQ_TOPO_PATH_PXB: return "PXB";
    case AGOQ_TOPO_PATH_PHB: return "PHB";
    case AGOQ_TOPO_PATH_SYS: return "SYS";
  }
  return "?";
}

/* NCCL's PCI ancestors of a device: itself, then every second sysfs level above it.
 * Returns the count (at least 1). */
static int agoq_topo_nccl_chain(const agoq_topo_pci* p, const char* chain[AGOQ_TOPO_MAX_DEPTH + 1]) {
  int n = 0;
  chain[n++] = p->busid;
  /* sysfs levels: bridges[0..nbridges-1] then the device at index nbridges. */
  for (int i = p->nbridges - 2; i >= 0; i -= 2) chain[n++] = p->bridges[i];
  return n;
}

agoq_topo_path_type agoq_topo_pci_path(const agoq_topo_pci* a, const agoq_topo_pci* b, int* hops) {
  int h = 0;
  agoq_topo_path_type type;
  if (strcmp(a->busid, b->busid) == 0) {
    type = AGOQ_TOPO_PATH_LOC;
    goto out;
  }
  const char* ca[AGOQ_TOPO_MAX_DEPTH + 1];
  const char* cb[AGOQ_TOPO_MAX_DEPTH + 1];
  int na = agoq_topo_nccl_chain(a, ca), nb = agoq_topo_nccl_chain(b, cb);
  /* Lowest common switch: the pair with the fewest links to it. */
  int best_i = -1, best_j = -1;
  for (int i = 0; i < na; i++) {
    for (int j = 0; j < nb; j++) {
      if (strcmp(ca[i], cb[j]) == 0 && (best_i < 0 || i + j < best_i + best_j)) {
        best_i = i;
        best_j = j;
      }
    }
  }
  if (best_i >= 0) {
    h = best_i + best_j;
    /* Device-switch links are PIX; any switch-switch link on the way makes it PXB. */
    type = best_i <= 1 && best_j <= 1 ? AGOQ_TOPO_PATH_PIX : AGOQ_TOPO_PATH_PXB;
    goto out;
  }
  /* Up to the CPU of each side: one link per NCCL node on the chain. NCCL has one CPU node
   * per NUMA node; two different ones are joined by a SYS link. */
  h = na + nb;
  if (a->numa == b->numa) {
    type = AGOQ_TOPO_PATH_PHB;
  } else {
    type = AGOQ_TOPO_PATH_SYS;
    h++;
  }
out:
  if (hops != NULL) *hops = h;
  return type;
}

agoq_topo_path_type agoq_topo_gpu_nic_path(const agoq_topo* t, int g, int n, int* hops) {
  const agoq_topo_gpu* gpu = &t->gpus[g];
  const agoq_topo_nic* nic = &t->nics[n];
  if (agoq_topo_nvl_fn != NULL && nic->has_pci &&
      agoq_topo_nvl_fn(agoq_topo_nvl_arg, gpu->pci.busid, nic->pci.busid)) {
    if (hops != NULL) *hops = 1;
    return AGOQ_TOPO_PATH_NVL;
  }
  if (nic->has_pci) return agoq_topo_pci_path(&gpu->pci, &nic->pci, hops);
  /* A NIC without a PCI device (virtual): NCCL hangs it under its first CPU. */
  int first_numa = t->nnuma > 0 ? t->numa[0].os_index : -1;
  const char* chain[AGOQ_TOPO_MAX_DEPTH + 1];
  int h = agoq_topo_nccl_chain(&gpu->pci, chain);
  agoq_topo_path_type type = AGOQ_TOPO_PATH_PHB;
  if (gpu->pci.numa != first_numa) {
    type = AGOQ_TOPO_PATH_SYS;
    h++;
  }
  if (hops != NULL) *hops = h;
  return type;
}
