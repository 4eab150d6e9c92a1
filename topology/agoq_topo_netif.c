/* Completes the TCP transport's interface list from the topology. The list itself (which
 * interfaces, in which order) stays the interface filter's: only facts are added. */
#include <string.h>

#include "agoq_topo_internal.h"

int agoq_topo_annotate_netifs(const agoq_topo* t, agoq_netif* ifs, int n) {
  int matched = 0;
  for (int i = 0; i < n; i++) {
    agoq_netif* nif = &ifs[i];
    const agoq_topo_nic* nic = NULL;
    for (int k = 0; k < t->nnics && nic == NULL; k++)
      if (strcmp(t->nics[k].netdev, nif->name) == 0) nic = &t->nics[k];
    if (nic == NULL || !nic->has_pci) continue;
    matched++;
    nif->numa_node = nic->pci.numa;
    int node = agoq_topo_numa_find(t, nic->pci.numa);
    nif->has_local_cpus = node >= 0 && CPU_COUNT(&t->numa[node].cpus) > 0;
    if (nif->has_local_cpus) nif->local_cpus = t->numa[node].cpus;
    else CPU_ZERO(&nif->local_cpus);
    /* The PCI function itself (a virtio NIC's "device" link points below it, at
     * virtio<N>, which NCCL cannot place and hangs under the first CPU). Only from this
     * machine: an XML topology's paths are not this host's. */
    if (t->this_system && nic->pci_path[0] != '\0' && strlen(nic->pci_path) < sizeof nif->pci_path) {
      strcpy(nif->pci_path, nic->pci_path);
      nif->has_pci_path = true;
    }
    /* Only a guess gives way (a link measured at exactly the default speed stays measured). */
    if (nif->speed_source == AGOQ_NETIF_SPEED_DEFAULT && nic->speed_mbps > 0) {
      nif->speed_mbps = nic->speed_mbps;
      nif->speed_source = AGOQ_NETIF_SPEED_TOPOLOGY;
    }
  }
  return matched;
}
