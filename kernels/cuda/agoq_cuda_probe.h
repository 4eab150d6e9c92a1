/*
 * Which CUDA devices this process can use, and where they sit on PCI.
 *
 * topology/ matches GPUs to NICs by PCI bus id (Debian's hwloc has no CUDA backend, so a
 * GPU is only a PCI device of class 0302 there). These functions are plain C so the
 * plugin and tools can call them without a CUDA toolchain; they are compiled by nvcc into
 * agoq_kernels_cuda, which carries the static CUDA runtime.
 */
#ifndef AGOQ_CUDA_PROBE_H
#define AGOQ_CUDA_PROBE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices visible to this process. 0 when there is no GPU, no driver, or
 * a driver older than the runtime (any cudaGetDeviceCount error): a machine without a GPU
 * is a normal configuration, not a failure. The error is cleared, so a later CUDA call
 * does not report it. */
int agoq_cuda_device_count(void);

/* Writes device `dev`'s PCI address as "dddd:bb:dd.f" in lowercase hex, the spelling of
 * /sys/bus/pci/devices and hwloc, into buf (len >= 13). Returns 0 on success; -1 when
 * dev is not a usable device, buf is NULL or too small, or CUDA fails (buf then holds "",
 * when len > 0, and the CUDA error is cleared). */
int agoq_cuda_pci_bus_id(int dev, char* buf, int len);

#ifdef __cplusplus
}
#endif
#endif
