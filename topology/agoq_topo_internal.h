/* Shared between the discovery back ends (hwloc, sysfs); not part of the API. */
#ifndef AGOQ_TOPO_INTERNAL_H
#define AGOQ_TOPO_INTERNAL_H

#include "agoq_topo.h"

/* After discovery: stable order (GPUs and NICs by bus id, then port), pciPath of every
 * PCI NIC, and on this machine the link speeds sysfs knows. */
void agoq_topo_finalize(agoq_topo* t);

/* Parses a sysfs device path (".../devices/pci0000:00/0000:00:01.0/0000:01:00.0[/virtio2]")
 * into `p`: the last PCI address is the device, the ones before it its bridges. numa is
 * left at -1. False when the path holds no PCI address. */
bool agoq_topo_parse_sysfs_path(const char* path, agoq_topo_pci* p);

/* Copies at most n-1 bytes and terminates; names longer than our fields are cut. */
void agoq_topo_strlcpy(char* dst, size_t n, const char* src);

/* "dddd:bb:dd.f" with hex digits. */
bool agoq_topo_is_busid(const char* s, size_t len);

#endif
