/*
 * Which NIC serves each GPU. On rail-optimised nodes (HGX/DGX) every PCIe switch holds as
 * many NICs as GPUs and traffic should stay on its rail: GPU i of a switch uses NIC i of
 * the same switch. Elsewhere (fewer NICs than GPUs, flat VMs) each GPU takes its nearest
 * NIC, several GPUs sharing one. With NVLink facts, "nearest" counts a NIC reached through
 * an NVLink peer GPU (PXN) as nearer than one behind the CPU, because NCCL routes it so.
 */
#include <string.h>

#include "agoq_topo.h"

typedef struct {
  agoq_topo_path_type type[AGOQ_TOPO_MAX_GPUS][AGOQ_TOPO_MAX_NICS];
  int hops[AGOQ_TOPO_MAX_GPUS][AGOQ_TOPO_MAX_NICS];
  int via[AGOQ_TOPO_MAX_GPUS][AGOQ_TOPO_MAX_NICS];
} agoq_topo_matrix;

/* True when (type a, hops a) is strictly better than (type b, hops b). */
static bool agoq_topo_better(agoq_topo_path_type ta, int ha, agoq_topo_path_type tb, int hb) {
  return ta < tb || (ta == tb && ha < hb);
}

static int agoq_topo_uf_find(int* parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

/* Groups of GPUs and NICs joined by paths that stay below the host bridge (a PXN path
 * crosses to another GPU's switch, so it joins nothing). Node ids:
 * GPUs 0..ngpus-1, NICs ngpus... True when every group with a GPU has as many NICs. */
static bool agoq_topo_rail_groups(const agoq_topo* t, const agoq_topo_matrix* m, int* group) {
  int parent[AGOQ_TOPO_MAX_GPUS + AGOQ_TOPO_MAX_NICS];
  int n = t->ngpus + t->nnics;
  for (int i = 0; i < n; i++) parent[i] = i;
  for (int g = 0; g < t->ngpus; g++) {
    for (int k = 0; k < t->nnics; k++) {
      if (m->type[g][k] > AGOQ_TOPO_PATH_PXB) continue;
      int a = agoq_topo_uf_find(parent, g), b = agoq_topo_uf_find(parent, t->ngpus + k);
      if (a != b) parent[a] = b;
    }
  }
  int gpus[AGOQ_TOPO_MAX_GPUS + AGOQ_TOPO_MAX_NICS] = {0}, nics[AGOQ_TOPO_MAX_GPUS + AGOQ_TOPO_MAX_NICS] = {0};
  for (int i = 0; i < n; i++) {
    group[i] = agoq_topo_uf_find(parent, i);
    if (i < t->ngpus) gpus[group[i]]++;
    else nics[group[i]]++;
  }
  for (int i = 0; i < n; i++)
    if (gpus[i] > 0 && gpus[i] != nics[i]) return false;
  return true;
}

void agoq_topo_choose(const agoq_topo* t, agoq_topo_choice* out) {
  static agoq_topo_matrix zero_matrix;
  agoq_topo_matrix m = zero_matrix;
  memset(out, 0, sizeof *out);
  for (int g = 0; g < AGOQ_TOPO_MAX_GPUS; g++) {
    out->nic[g] = -1;
    out->path[g] = AGOQ_TOPO_PATH_SYS;
    out->via[g] = -1;
  }
  if (t->ngpus == 0 || t->nnics == 0) return;
  for (int g = 0; g < t->ngpus; g++)
    for (int k = 0; k < t->nnics; k++)
      m.type[g][k] = agoq_topo_gpu_nic_route(t, g, k, &m.hops[g][k], &m.via[g][k]);

  int group[AGOQ_TOPO_MAX_GPUS + AGOQ_TOPO_MAX_NICS];
  out->rail_aligned = agoq_topo_rail_groups(t, &m, group);
  if (out->rail_aligned) {
    /* Inside each group, pair greedily: the best remaining (path, hops) pair first, ties
     * to the lowest GPU then NIC index, so GPU order follows NIC order under a switch. */
    bool nic_used[AGOQ_TOPO_MAX_NICS] = {false};
    for (int round = 0; round < t->ngpus; round++) {
      int bg = -1, bk = -1;
      for (int g = 0; g < t->ngpus; g++) {
        if (out->nic[g] >= 0) continue;
        for (int k = 0; k < t->nnics; k++) {
          if (nic_used[k] || group[g] != group[t->ngpus + k]) continue;
          if (bg < 0 || agoq_topo_better(m.type[g][k], m.hops[g][k], m.type[bg][bk], m.hops[bg][bk])) {
            bg = g;
            bk = k;
          }
        }
      }
      if (bg < 0) break;
      out->nic[bg] = bk;
      out->path[bg] = m.type[bg][bk];
      out->via[bg] = m.via[bg][bk];
      nic_used[bk] = true;
    }
    return;
  }
  for (int g = 0; g < t->ngpus; g++) {
    int best = 0;
    for (int k = 1; k < t->nnics; k++)
      if (agoq_topo_better(m.type[g][k], m.hops[g][k], m.type[g][best], m.hops[g][best])) best = k;
    out->nic[g] = best;
    out->path[g] = m.type[g][best];
    out->via[g] = m.via[g][best];
  }
}
