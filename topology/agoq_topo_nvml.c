/* NVLink facts for the GPUs the topology found. Neither hwloc (Debian's has no NVML backend)
 * nor sysfs knows which GPUs share NVLinks or NVSwitches, and NCCL's paths depend on it
 * (NVL between GPUs, PXN to NICs), so we ask NVML the way NCCL's topology code does: per
 * GPU, per link, is it usable for P2P and up, and what is at the other end. NVML is dlopened
 * (libnvidia-ml.so.1 or a path the caller gives, e.g. the fake NVML of the tests): no link
 * dependency, and a host without it keeps the PCI answers. Knows nothing of NCCL. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "agoq_topo.h"

/* The NVML ABI subset we call, declared from NVIDIA's public nvml.h (return codes, enum
 * values and struct layouts are part of NVML's stable ABI; the _v2/_v3 names are the
 * versioned symbols the unversioned macros of nvml.h resolve to). */
typedef int agoq_nvml_return;
enum {
  AGOQ_NVML_SUCCESS = 0,
  AGOQ_NVML_FEATURE_ENABLED = 1,     /* nvmlEnableState_t */
  AGOQ_NVML_CAP_P2P_SUPPORTED = 0,   /* nvmlNvLinkCapability_t */
  AGOQ_NVML_LINK_DEV_GPU = 0x00,     /* nvmlIntNvLinkDeviceType_t */
  AGOQ_NVML_LINK_DEV_IBMNPU = 0x01,
  AGOQ_NVML_LINK_DEV_SWITCH = 0x02,
  AGOQ_NVML_LINK_DEV_UNKNOWN = 0xff,
};
typedef struct agoq_nvml_device_st* agoq_nvml_device; /* nvmlDevice_t: opaque */
typedef struct {                                      /* nvmlPciInfo_t (v3 layout) */
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32]; /* "00000000:13:00.0": 8-digit domain, upper-case hex */
} agoq_nvml_pci_info;

typedef agoq_nvml_return (*agoq_nvml_void_fn)(void);
typedef const char* (*agoq_nvml_error_string_fn)(agoq_nvml_return rc);
typedef agoq_nvml_return (*agoq_nvml_count_fn)(unsigned* count);
typedef agoq_nvml_return (*agoq_nvml_handle_fn)(unsigned index, agoq_nvml_device* dev);
typedef agoq_nvml_return (*agoq_nvml_pci_fn)(agoq_nvml_device dev, agoq_nvml_pci_info* pci);
typedef agoq_nvml_return (*agoq_nvml_link_int_fn)(agoq_nvml_device dev, unsigned link, int* out);
typedef agoq_nvml_return (*agoq_nvml_link_pci_fn)(agoq_nvml_device dev, unsigned link, agoq_nvml_pci_info* pci);
typedef agoq_nvml_return (*agoq_nvml_link_cap_fn)(agoq_nvml_device dev, unsigned link, int cap, unsigned* result);

typedef struct {
  agoq_nvml_void_fn init, shutdown;
  agoq_nvml_error_string_fn error_string; /* optional */
  agoq_nvml_count_fn count;
  agoq_nvml_handle_fn handle;
  agoq_nvml_pci_fn pci;
  agoq_nvml_link_int_fn link_state;
  agoq_nvml_link_cap_fn link_cap;       /* optional: older NVML lacks nothing here, a fake may */
  agoq_nvml_link_pci_fn link_pci;       /* optional: remote bus ids unknown without it */
  agoq_nvml_link_int_fn link_type;      /* optional (NVML 11.x+): else guessed as NCCL does */
} agoq_nvml_api;

const char* agoq_topo_nvl_remote_name(agoq_topo_nvl_remote r) {
  switch (r) {
    case AGOQ_TOPO_NVL_GPU: return "gpu";
    case AGOQ_TOPO_NVL_CPU: return "cpu";
    case AGOQ_TOPO_NVL_SWITCH: return "nvswitch";
    case AGOQ_TOPO_NVL_UNKNOWN: return "unknown";
  }
  return "?";
}

static const char* agoq_topo_nvml_err(const agoq_nvml_api* api, agoq_nvml_return rc, char* buf, size_t len) {
  const char* s = api->error_string != NULL ? api->error_string(rc) : NULL;
  if (s != NULL) snprintf(buf, len, "%s (%d)", s, rc);
  else snprintf(buf, len, "NVML error %d", rc);
  return buf;
}

/* NVML's "00000000:1A:00.0" (or, without busId, its domain/bus/device numbers) in our
 * sysfs spelling "0000:1a:00.0"; "" when it does not fit (a remote NVML cannot see, which it
 * reports with out-of-range numbers). */
static void agoq_topo_nvml_busid(const agoq_nvml_pci_info* p, char out[AGOQ_TOPO_BUSID_LEN]) {
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  out[0] = '\0';
  char tail;
  if (sscanf(p->bus_id, "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) != 4) {
    if (p->bus_id[0] != '\0') return;
    dom = p->domain;
    bus = p->bus;
    dev = p->device;
    fn = 0;
  }
  if (dom > 0xffff || bus > 0xff || dev > 0x1f || fn > 7) return;
  snprintf(out, AGOQ_TOPO_BUSID_LEN, "%04x:%02x:%02x.%x", dom, bus, dev, fn);
}

/* "NVML not usable: ..." into t->nvml_why. */
static int agoq_topo_nvml_fail(agoq_topo* t, const char* what, const char* detail) {
  snprintf(t->nvml_why, sizeof t->nvml_why, "%s: %s", what, detail);
  t->nvml_state = AGOQ_TOPO_NVML_UNAVAILABLE;
  return 0;
}

static void* agoq_topo_nvml_sym(void* lib, const char* name, const char* fallback) {
  void* p = dlsym(lib, name);
  if (p == NULL && fallback != NULL) p = dlsym(lib, fallback);
  return p;
}

/* Every usable, active NVLink of NVML device `dev`, into gpu->nvlink[]. `known` holds the
 * bus ids of all NVML devices, to tell a GPU from an NVSwitch when NVML cannot say. */
static void agoq_topo_nvml_links(const agoq_topo* t, const agoq_nvml_api* api, agoq_nvml_device dev,
                                 char known[][AGOQ_TOPO_BUSID_LEN], int nknown, agoq_topo_gpu* gpu) {
  for (unsigned l = 0; l < AGOQ_TOPO_NVLINK_MAX; l++) {
    /* NCCL skips links that cannot carry P2P (an SLI bridge) and links that are down; a GPU
     * with fewer links answers INVALID_ARGUMENT past its last one, without NVLink
     * NOT_SUPPORTED: both mean "no link here". */
    if (api->link_cap != NULL) {
      unsigned p2p = 0;
      if (api->link_cap(dev, l, AGOQ_NVML_CAP_P2P_SUPPORTED, &p2p) != AGOQ_NVML_SUCCESS || p2p == 0) continue;
    }
    int active = 0;
    if (api->link_state(dev, l, &active) != AGOQ_NVML_SUCCESS || active != AGOQ_NVML_FEATURE_ENABLED) continue;

    agoq_topo_nvlink* link = &gpu->nvlink[gpu->nvlinks++];
    memset(link, 0, sizeof *link);
    link->link = (int)l;
    link->gpu = -1;
    agoq_nvml_pci_info remote;
    memset(&remote, 0, sizeof remote);
    if (api->link_pci != NULL && api->link_pci(dev, l, &remote) == AGOQ_NVML_SUCCESS)
      agoq_topo_nvml_busid(&remote, link->busid);

    int type = -1;
    if (api->link_type == NULL || api->link_type(dev, l, &type) != AGOQ_NVML_SUCCESS) type = -1;
    switch (type) {
      case AGOQ_NVML_LINK_DEV_GPU: link->remote = AGOQ_TOPO_NVL_GPU; break;
      case AGOQ_NVML_LINK_DEV_IBMNPU: link->remote = AGOQ_TOPO_NVL_CPU; break;
      case AGOQ_NVML_LINK_DEV_SWITCH: link->remote = AGOQ_TOPO_NVL_SWITCH; break;
      case AGOQ_NVML_LINK_DEV_UNKNOWN: link->remote = AGOQ_TOPO_NVL_UNKNOWN; break;
      default: {
        /* No answer (an NVML older than the call): a far end that is one of NVML's GPUs is
         * a GPU; anything else is taken for an NVSwitch, as NCCL does for a remote device
         * it cannot see. */
        bool is_gpu = false;
        for (int k = 0; k < nknown && link->busid[0] != '\0' && !is_gpu; k++)
          is_gpu = agoq_topo_busid_equal(known[k], link->busid);
        link->remote = is_gpu ? AGOQ_TOPO_NVL_GPU : AGOQ_TOPO_NVL_SWITCH;
        break;
      }
    }
    if (link->remote == AGOQ_TOPO_NVL_GPU && link->busid[0] != '\0') {
      for (int g = 0; g < t->ngpus; g++) {
        if (agoq_topo_busid_equal(t->gpus[g].pci.busid, link->busid)) {
          link->gpu = g;
          break;
        }
      }
    }
    if (link->remote == AGOQ_TOPO_NVL_SWITCH) gpu->nvswitch = true;
  }
}

int agoq_topo_nvml_annotate(agoq_topo* t, const char* lib_path) {
  for (int g = 0; g < t->ngpus; g++) {
    agoq_topo_gpu* gpu = &t->gpus[g];
    gpu->nvml = false;
    gpu->nvlinks = 0;
    gpu->nvswitch = false;
    memset(gpu->nvlink, 0, sizeof gpu->nvlink);
  }
  t->nvml_why[0] = '\0';
  const char* path = lib_path != NULL ? lib_path : "libnvidia-ml.so.1";
  dlerror();
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    const char* err = dlerror();
    return agoq_topo_nvml_fail(t, "NVML not loaded", err != NULL ? err : path);
  }
  /* NVML stays loaded: like NCCL we never unload it (its library may keep threads and
   * handlers after nvmlShutdown), and a second dlopen of the same path is a reference. */
  agoq_nvml_api api;
  memset(&api, 0, sizeof api);
  api.init = (agoq_nvml_void_fn)agoq_topo_nvml_sym(lib, "nvmlInit_v2", "nvmlInit");
  api.shutdown = (agoq_nvml_void_fn)agoq_topo_nvml_sym(lib, "nvmlShutdown", NULL);
  api.error_string = (agoq_nvml_error_string_fn)agoq_topo_nvml_sym(lib, "nvmlErrorString", NULL);
  api.count = (agoq_nvml_count_fn)agoq_topo_nvml_sym(lib, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
  api.handle =
      (agoq_nvml_handle_fn)agoq_topo_nvml_sym(lib, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
  api.pci = (agoq_nvml_pci_fn)agoq_topo_nvml_sym(lib, "nvmlDeviceGetPciInfo_v3", NULL);
  api.link_state = (agoq_nvml_link_int_fn)agoq_topo_nvml_sym(lib, "nvmlDeviceGetNvLinkState", NULL);
  api.link_cap = (agoq_nvml_link_cap_fn)agoq_topo_nvml_sym(lib, "nvmlDeviceGetNvLinkCapability", NULL);
  api.link_pci = (agoq_nvml_link_pci_fn)agoq_topo_nvml_sym(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2", NULL);
  api.link_type = (agoq_nvml_link_int_fn)agoq_topo_nvml_sym(lib, "nvmlDeviceGetNvLinkRemoteDeviceType", NULL);
  const char* missing = api.init == NULL         ? "nvmlInit_v2"
                        : api.shutdown == NULL   ? "nvmlShutdown"
                        : api.count == NULL      ? "nvmlDeviceGetCount_v2"
                        : api.handle == NULL     ? "nvmlDeviceGetHandleByIndex_v2"
                        : api.pci == NULL        ? "nvmlDeviceGetPciInfo_v3"
                        : api.link_state == NULL ? "nvmlDeviceGetNvLinkState"
                                                 : NULL;
  char detail[160];
  if (missing != NULL) {
    snprintf(detail, sizeof detail, "%s has no %s", path, missing);
    return agoq_topo_nvml_fail(t, "NVML not usable", detail);
  }
  agoq_nvml_return rc = api.init();
  if (rc != AGOQ_NVML_SUCCESS) {
    char err[96];
    snprintf(detail, sizeof detail, "nvmlInit_v2: %s", agoq_topo_nvml_err(&api, rc, err, sizeof err));
    return agoq_topo_nvml_fail(t, "NVML not usable", detail);
  }
  unsigned count = 0;
  rc = api.count(&count);
  if (rc != AGOQ_NVML_SUCCESS) {
    char err[96];
    snprintf(detail, sizeof detail, "nvmlDeviceGetCount_v2: %s", agoq_topo_nvml_err(&api, rc, err, sizeof err));
    api.shutdown();
    return agoq_topo_nvml_fail(t, "NVML not usable", detail);
  }
  if (count > AGOQ_TOPO_MAX_GPUS) count = AGOQ_TOPO_MAX_GPUS;
  agoq_nvml_device devs[AGOQ_TOPO_MAX_GPUS];
  char busids[AGOQ_TOPO_MAX_GPUS][AGOQ_TOPO_BUSID_LEN];
  int n = 0;
  for (unsigned i = 0; i < count; i++) {
    agoq_nvml_pci_info pci;
    memset(&pci, 0, sizeof pci);
    /* A device NVML cannot open (no permission, fallen off the bus) is left out, not fatal. */
    if (api.handle(i, &devs[n]) != AGOQ_NVML_SUCCESS || api.pci(devs[n], &pci) != AGOQ_NVML_SUCCESS) continue;
    agoq_topo_nvml_busid(&pci, busids[n]);
    if (busids[n][0] != '\0') n++;
  }
  /* NVML's own order is not ours (nor CUDA's): match by bus id. */
  int matched = 0;
  for (int d = 0; d < n; d++) {
    for (int g = 0; g < t->ngpus; g++) {
      agoq_topo_gpu* gpu = &t->gpus[g];
      if (gpu->nvml || !agoq_topo_busid_equal(busids[d], gpu->pci.busid)) continue;
      gpu->nvml = true;
      agoq_topo_nvml_links(t, &api, devs[d], busids, n, gpu);
      matched++;
      break;
    }
  }
  api.shutdown();
  t->nvml_state = AGOQ_TOPO_NVML_LOADED;
  return matched;
}

bool agoq_topo_nvml_nvl_hook(void* topo, const char* gpu_busid, const char* nic_busid) {
  const agoq_topo* t = topo;
  if (t == NULL || t->nvml_state != AGOQ_TOPO_NVML_LOADED) return false;
  for (int g = 0; g < t->ngpus; g++) {
    const agoq_topo_gpu* gpu = &t->gpus[g];
    if (!agoq_topo_busid_equal(gpu->pci.busid, gpu_busid)) continue;
    for (int l = 0; l < gpu->nvlinks; l++)
      if (gpu->nvlink[l].busid[0] != '\0' && agoq_topo_busid_equal(gpu->nvlink[l].busid, nic_busid)) return true;
    return false;
  }
  return false;
}
