#include "agoq_cuda_probe.h"

#include <cuda_runtime_api.h>

#include <ctype.h>
#include <string.h>

/* "dddd:bb:dd.f" plus the terminator. */
#define AGOQ_PCI_BUS_ID_LEN 13

extern "C" int agoq_cuda_device_count(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    /* Without a driver this is cudaErrorInsufficientDriver (35), not cudaErrorNoDevice:
     * every error means "no usable GPU". Clear it so it does not surface later. */
    (void)cudaGetLastError();
    return 0;
  }
  return count > 0 ? count : 0;
}

extern "C" int agoq_cuda_pci_bus_id(int dev, char* buf, int len) {
  if (buf == NULL || len <= 0) return -1;
  buf[0] = '\0';
  if (len < AGOQ_PCI_BUS_ID_LEN || dev < 0 || dev >= agoq_cuda_device_count()) return -1;

  /* CUDA writes upper-case hex; sysfs and hwloc spell bus ids in lower case. */
  char id[AGOQ_PCI_BUS_ID_LEN + 3];
  if (cudaDeviceGetPCIBusId(id, (int)sizeof(id), dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  size_t n = strnlen(id, sizeof(id));
  if (n == sizeof(id) || n + 1 > (size_t)len) return -1;
  for (size_t i = 0; i <= n; i++) buf[i] = (char)tolower((unsigned char)id[i]);
  return 0;
}
