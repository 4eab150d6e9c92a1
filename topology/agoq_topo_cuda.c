/* CUDA device ordinals for the GPUs the topology found. Debian's hwloc has no CUDA backend,
 * so GPUs are PCI devices only; when a CUDA driver is present we ask it for each device's
 * PCI bus id and match. The driver is dlopened (libcuda.so.1): no link dependency, and a
 * host without it simply keeps ordinals unknown. Knows nothing of NCCL. */
#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "agoq_topo.h"

/* "00000000:19:00.0" (CUDA) and "0000:19:00.0" (sysfs) name the same device: compare the
 * domain as a number and the rest case-insensitively. */
bool agoq_topo_busid_equal(const char* a, const char* b) {
  unsigned da = 0, db = 0;
  char ra[32], rb[32];
  if (sscanf(a, "%x:%31s", &da, ra) != 2 || sscanf(b, "%x:%31s", &db, rb) != 2) return false;
  if (da != db || strlen(ra) != strlen(rb)) return false;
  for (size_t i = 0; ra[i] != '\0'; i++)
    if (tolower((unsigned char)ra[i]) != tolower((unsigned char)rb[i])) return false;
  return true;
}

int agoq_topo_match_cuda(agoq_topo* t, const char* const* busids, int n) {
  int matched = 0;
  for (int g = 0; g < t->ngpus; g++) t->gpus[g].cuda = -1;
  for (int d = 0; d < n; d++) {
    for (int g = 0; g < t->ngpus; g++) {
      if (t->gpus[g].cuda < 0 && agoq_topo_busid_equal(busids[d], t->gpus[g].pci.busid)) {
        t->gpus[g].cuda = d;
        matched++;
        break;
      }
    }
  }
  return matched;
}

/* The CUDA driver API subset we need (stable since CUDA 4: plain ints and a char buffer). */
typedef int (*agoq_cu_init_fn)(unsigned flags);
typedef int (*agoq_cu_count_fn)(int* count);
typedef int (*agoq_cu_get_fn)(int* dev, int ordinal);
typedef int (*agoq_cu_busid_fn)(char* buf, int len, int dev);

int agoq_topo_cuda_annotate(agoq_topo* t) {
  for (int g = 0; g < t->ngpus; g++) t->gpus[g].cuda = -1;
  if (!t->this_system) return 0; /* an XML file's GPUs are not this machine's devices */
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) return 0;
  agoq_cu_init_fn cu_init = (agoq_cu_init_fn)dlsym(lib, "cuInit");
  agoq_cu_count_fn cu_count = (agoq_cu_count_fn)dlsym(lib, "cuDeviceGetCount");
  agoq_cu_get_fn cu_get = (agoq_cu_get_fn)dlsym(lib, "cuDeviceGet");
  agoq_cu_busid_fn cu_busid = (agoq_cu_busid_fn)dlsym(lib, "cuDeviceGetPCIBusId");
  int count = 0, matched = 0;
  if (cu_init != NULL && cu_count != NULL && cu_get != NULL && cu_busid != NULL && cu_init(0) == 0 &&
      cu_count(&count) == 0 && count > 0) {
    if (count > AGOQ_TOPO_MAX_GPUS) count = AGOQ_TOPO_MAX_GPUS;
    char ids[AGOQ_TOPO_MAX_GPUS][32];
    const char* ptrs[AGOQ_TOPO_MAX_GPUS];
    int n = 0;
    for (int i = 0; i < count; i++) {
      int dev = 0;
      if (cu_get(&dev, i) != 0 || cu_busid(ids[n], (int)sizeof ids[n], dev) != 0) break;
      ptrs[n] = ids[n];
      n++;
    }
    matched = agoq_topo_match_cuda(t, ptrs, n);
  }
  /* The driver stays loaded: unloading a CUDA driver after cuInit is not supported. */
  return matched;
}
