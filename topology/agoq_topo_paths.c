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
 *
 * With NVLink facts from NVML (agoq_topo_nvml.c), two GPUs joined by NVLink, directly or
 * through NVSwitches, are NVL to each other (NCCL puts all NVSwitches of a node in one node
 * of its graph, so every GPU with a switch link reaches every other one in two NVL hops),
 * and a GPU may reach a NIC through such a peer: NCCL's PXN.
 */
#include <stdint.h>
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
    case AGOQ_TOPO_PATH_PXN: return "PXN";
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

/* GPU g to NIC n by the hook and the PCI tree only: what NCCL's graph has before PXN. */
agoq_topo_path_type agoq_topo_gpu_nic_direct(const agoq_topo* t, int g, int n, int* hops) {
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

int agoq_topo_gpu_nvlinks(const agoq_topo* t, int a, int b) {
  if (a == b || a < 0 || b < 0 || a >= t->ngpus || b >= t->ngpus) return 0;
  const agoq_topo_gpu* ga = &t->gpus[a];
  const agoq_topo_gpu* gb = &t->gpus[b];
  /* Each side's NVML lists its own links; take the larger count so one GPU NVML could not
   * describe (another container's, say) still shows the links its peer sees. */
  int ab = 0, ba = 0, sa = 0, sb = 0;
  for (int l = 0; l < ga->nvlinks; l++) {
    if (ga->nvlink[l].remote == AGOQ_TOPO_NVL_GPU && ga->nvlink[l].gpu == b) ab++;
    if (ga->nvlink[l].remote == AGOQ_TOPO_NVL_SWITCH) sa++;
  }
  for (int l = 0; l < gb->nvlinks; l++) {
    if (gb->nvlink[l].remote == AGOQ_TOPO_NVL_GPU && gb->nvlink[l].gpu == a) ba++;
    if (gb->nvlink[l].remote == AGOQ_TOPO_NVL_SWITCH) sb++;
  }
  int direct = ab > ba ? ab : ba;
  /* Through the switches, traffic is bounded by the side with fewer switch links. */
  int switched = sa > 0 && sb > 0 ? (sa < sb ? sa : sb) : 0;
  return direct + switched;
}

agoq_topo_path_type agoq_topo_gpu_gpu_path(const agoq_topo* t, int a, int b, int* hops) {
  if (a == b) {
    if (hops != NULL) *hops = 0;
    return AGOQ_TOPO_PATH_LOC;
  }
  if (agoq_topo_gpu_nvlinks(t, a, b) > 0) {
    bool direct = false;
    for (int l = 0; l < t->gpus[a].nvlinks && !direct; l++)
      direct = t->gpus[a].nvlink[l].remote == AGOQ_TOPO_NVL_GPU && t->gpus[a].nvlink[l].gpu == b;
    for (int l = 0; l < t->gpus[b].nvlinks && !direct; l++)
      direct = t->gpus[b].nvlink[l].remote == AGOQ_TOPO_NVL_GPU && t->gpus[b].nvlink[l].gpu == a;
    if (hops != NULL) *hops = direct ? 1 : 2; /* GPU-GPU, or GPU-NVSwitch-GPU */
    return AGOQ_TOPO_PATH_NVL;
  }
  return agoq_topo_pci_path(&t->gpus[a].pci, &t->gpus[b].pci, hops);
}

/* The GPUs nearest NIC n by its direct paths, as a bit set (AGOQ_TOPO_MAX_GPUS is 64). */
static uint64_t agoq_topo_nic_nearest_gpus(const agoq_topo* t, int n) {
  uint64_t set = 0;
  agoq_topo_path_type best = AGOQ_TOPO_PATH_SYS;
  int best_hops = 0;
  for (int g = 0; g < t->ngpus && g < 64; g++) {
    int h;
    agoq_topo_path_type type = agoq_topo_gpu_nic_direct(t, g, n, &h);
    if (set == 0 || type < best || (type == best && h < best_hops)) {
      set = 0;
      best = type;
      best_hops = h;
    }
    if (type == best && h == best_hops) set |= (uint64_t)1 << g;
  }
  return set;
}

int agoq_topo_nic_local_gpu(const agoq_topo* t, int n) {
  uint64_t mine = agoq_topo_nic_nearest_gpus(t, n);
  if (mine == 0) return -1;
  /* NCCL spreads the NICs near a set of GPUs over those GPUs (each GPU takes "its" NIC by
   * device number), so the k-th NIC of a PCIe switch relays through the k-th GPU there. */
  int k = 0;
  for (int other = 0; other < n; other++)
    if (agoq_topo_nic_nearest_gpus(t, other) == mine) k++;
  int count = 0;
  for (int g = 0; g < 64; g++)
    if (mine & ((uint64_t)1 << g)) count++;
  k %= count;
  for (int g = 0; g < 64; g++) {
    if ((mine & ((uint64_t)1 << g)) == 0) continue;
    if (k-- == 0) return g;
  }
  return -1;
}

agoq_topo_path_type agoq_topo_gpu_nic_route(const agoq_topo* t, int g, int n, int* hops, int* via) {
  int h = 0;
  agoq_topo_path_type type = agoq_topo_gpu_nic_direct(t, g, n, &h);
  if (via != NULL) *via = -1;
  /* PXN only replaces a path through a CPU, and only with NVLink facts (the cheap test
   * first: no NVLink on this GPU, no PXN, and no hook calls for other GPUs). NCCL also
   * takes a relay with more bandwidth than a direct PIX/PXB path; agoq has no bandwidths,
   * and NCCL's GPU Direct RDMA check on the relay is assumed to pass. */
  if (t->gpus[g].nvlinks > 0 && type > AGOQ_TOPO_PATH_PXN) {
    int p = agoq_topo_nic_local_gpu(t, n);
    int ph = 0, gh = 0;
    if (p >= 0 && p != g && agoq_topo_gpu_nic_direct(t, p, n, &ph) <= AGOQ_TOPO_PATH_PXB &&
        agoq_topo_gpu_gpu_path(t, g, p, &gh) == AGOQ_TOPO_PATH_NVL) {
      type = AGOQ_TOPO_PATH_PXN;
      h = gh + ph;
      if (via != NULL) *via = p;
    }
  }
  if (hops != NULL) *hops = h;
  return type;
}

agoq_topo_path_type agoq_topo_gpu_nic_path(const agoq_topo* t, int g, int n, int* hops) {
  return agoq_topo_gpu_nic_route(t, g, n, hops, NULL);
}
