/*
 * A fake libnvidia-ml for the topology tests: it exports the NVML calls agoq_topo_nvml.c
 * makes, answering for a machine chosen by AGOQ_FAKE_NVML_SCENARIO (read by nvmlInit_v2):
 *
 *   nvswitch8        the GPUs of tests/fixtures/topo/hgx-h100.xml (an HGX H100 board), each
 *                    with 18 NVLinks to four NVSwitches (5+4+4+5 links), enumerated in
 *                    reverse bus order so matching by bus id, not by index, is tested
 *   pcie             the GPUs of gpus8-nics2.xml without NVLink (every NVLink call answers
 *                    NOT_SUPPORTED, as for a PCIe card without bridges)
 *   nvswitch8-gpus8  the GPUs of gpus8-nics2.xml on an NVSwitch fabric (PXN to the other
 *                    socket's NIC)
 *   pairs            the GPUs of hgx-h100.xml with 12 NVLinks of which 4 are up, bridged in
 *                    pairs (GPU 2k with 2k+1), and no nvmlDeviceGetNvLinkRemoteDeviceType
 *                    answer (FUNCTION_NOT_FOUND, as an old NVML): the caller must tell GPUs
 *                    from switches by bus id
 *   nodriver         nvmlInit_v2 fails with DRIVER_NOT_LOADED
 *
 * It is strict the way NVML is, and stricter: every call but nvmlInit_v2 / nvmlErrorString
 * answers UNINITIALIZED before nvmlInit_v2 (and after the matching nvmlShutdown); a NULL
 * pointer, a handle it did not give out, an index past the device count, a link index past
 * the device's links or an unknown capability are INVALID_ARGUMENT. Calls a correct caller
 * never makes (before init, NULL pointers, foreign handles, a link >= NVML_NVLINK_MAX_LINKS,
 * an extra nvmlShutdown) are counted: agoq_fake_nvml_misuse() lets a test assert there were
 * none, agoq_fake_nvml_refcount() that every init was shut down.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AGOQ_FAKE_EXPORT __attribute__((visibility("default")))

/* NVML's ABI values (nvml.h). */
enum {
  AGOQ_FAKE_SUCCESS = 0,
  AGOQ_FAKE_ERROR_UNINITIALIZED = 1,
  AGOQ_FAKE_ERROR_INVALID_ARGUMENT = 2,
  AGOQ_FAKE_ERROR_NOT_SUPPORTED = 3,
  AGOQ_FAKE_ERROR_DRIVER_NOT_LOADED = 9,
  AGOQ_FAKE_ERROR_FUNCTION_NOT_FOUND = 13,
  AGOQ_FAKE_ERROR_UNKNOWN = 999,
  AGOQ_FAKE_MAX_LINKS = 18, /* NVML_NVLINK_MAX_LINKS */
  AGOQ_FAKE_CAP_COUNT = 6,  /* nvmlNvLinkCapability_t: P2P_SUPPORTED (0) .. VALID (5) */
  AGOQ_FAKE_DEV_GPU = 0,
  AGOQ_FAKE_DEV_SWITCH = 2,
};
typedef int agoq_fake_return;
typedef struct {
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} agoq_fake_pci_info;

typedef struct {
  int active;       /* NVML_FEATURE_ENABLED */
  int remote_type;  /* nvmlIntNvLinkDeviceType_t */
  int remote;       /* index of the far end: a device (GPU) or a switch */
} agoq_fake_link;

typedef struct agoq_fake_device {
  unsigned domain, bus;
  int links;        /* NVLinks this GPU has; 0 = no NVLink at all */
  agoq_fake_link link[AGOQ_FAKE_MAX_LINKS];
} agoq_fake_device;
typedef agoq_fake_device* agoq_fake_handle;

static const unsigned agoq_fake_hgx_buses[8] = {0x13, 0x15, 0x43, 0x45, 0x93, 0x95, 0xc3, 0xc5};
static const unsigned agoq_fake_gpus8_buses[8] = {0x25, 0x26, 0x2d, 0x2e, 0xa5, 0xa6, 0xad, 0xae};
static const unsigned agoq_fake_switch_buses[4] = {0x05, 0x06, 0x07, 0x08};

static agoq_fake_device agoq_fake_devs[8];
static int agoq_fake_ndevs;
static int agoq_fake_init_count;
static int agoq_fake_misuse_count;
static int agoq_fake_no_remote_type;

static agoq_fake_return agoq_fake_misuse(agoq_fake_return rc, const char* what) {
  agoq_fake_misuse_count++;
  if (getenv("AGOQ_FAKE_NVML_VERBOSE") != NULL) fprintf(stderr, "fake-nvml: misuse: %s\n", what);
  return rc;
}

/* Eight GPUs on `buses`; `fabric` 's' = 18 links each to four NVSwitches, 'p' = 12 links of
 * which 4 bridge GPU pairs, 'n' = no NVLink; `reverse` enumerates them backwards. */
static void agoq_fake_build(const unsigned buses[8], char fabric, int reverse) {
  memset(agoq_fake_devs, 0, sizeof agoq_fake_devs);
  agoq_fake_ndevs = 8;
  for (int i = 0; i < 8; i++) {
    int slot = reverse ? 7 - i : i;
    agoq_fake_device* d = &agoq_fake_devs[slot];
    d->domain = 0;
    d->bus = buses[i];
    if (fabric == 's') {
      d->links = 18;
      for (int l = 0; l < 18; l++) {
        d->link[l].active = 1;
        d->link[l].remote_type = AGOQ_FAKE_DEV_SWITCH;
        d->link[l].remote = l < 5 ? 0 : l < 9 ? 1 : l < 13 ? 2 : 3;
      }
    } else if (fabric == 'p') {
      d->links = 12;
      int peer = i ^ 1;
      for (int l = 0; l < 4; l++) {
        d->link[l].active = 1;
        d->link[l].remote_type = AGOQ_FAKE_DEV_GPU;
        d->link[l].remote = reverse ? 7 - peer : peer;
      }
    }
  }
}

static agoq_fake_return agoq_fake_check_init(void) {
  if (agoq_fake_init_count == 0) return agoq_fake_misuse(AGOQ_FAKE_ERROR_UNINITIALIZED, "call before nvmlInit_v2");
  return AGOQ_FAKE_SUCCESS;
}

static agoq_fake_return agoq_fake_check_dev(agoq_fake_handle dev) {
  agoq_fake_return rc = agoq_fake_check_init();
  if (rc != AGOQ_FAKE_SUCCESS) return rc;
  for (int i = 0; i < agoq_fake_ndevs; i++)
    if (dev == &agoq_fake_devs[i]) return AGOQ_FAKE_SUCCESS;
  return agoq_fake_misuse(AGOQ_FAKE_ERROR_INVALID_ARGUMENT, "foreign device handle");
}

/* A link query: the device's link `link`, or an error. */
static agoq_fake_return agoq_fake_check_link(agoq_fake_handle dev, unsigned link, const void* out,
                                             const agoq_fake_link** l) {
  agoq_fake_return rc = agoq_fake_check_dev(dev);
  if (rc != AGOQ_FAKE_SUCCESS) return rc;
  if (out == NULL) return agoq_fake_misuse(AGOQ_FAKE_ERROR_INVALID_ARGUMENT, "NULL result pointer");
  if (link >= AGOQ_FAKE_MAX_LINKS)
    return agoq_fake_misuse(AGOQ_FAKE_ERROR_INVALID_ARGUMENT, "link >= NVML_NVLINK_MAX_LINKS");
  if (dev->links == 0) return AGOQ_FAKE_ERROR_NOT_SUPPORTED;
  if (link >= (unsigned)dev->links) return AGOQ_FAKE_ERROR_INVALID_ARGUMENT; /* past this GPU's links */
  *l = &dev->link[link];
  return AGOQ_FAKE_SUCCESS;
}

static void agoq_fake_pci(unsigned domain, unsigned bus, unsigned pci_device_id, agoq_fake_pci_info* pci) {
  memset(pci, 0, sizeof *pci);
  pci->domain = domain;
  pci->bus = bus;
  pci->device = 0;
  pci->pciDeviceId = pci_device_id;
  snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:00.0", domain, bus);
  snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:00.0", domain, bus);
}

AGOQ_FAKE_EXPORT agoq_fake_return nvmlInit_v2(void) {
  if (agoq_fake_init_count > 0) {
    agoq_fake_init_count++; /* NVML counts nested inits */
    return AGOQ_FAKE_SUCCESS;
  }
  const char* s = getenv("AGOQ_FAKE_NVML_SCENARIO");
  agoq_fake_no_remote_type = 0;
  if (s == NULL) s = "";
  if (strcmp(s, "nvswitch8") == 0) {
    agoq_fake_build(agoq_fake_hgx_buses, 's', 1);
  } else if (strcmp(s, "pcie") == 0) {
    agoq_fake_build(agoq_fake_gpus8_buses, 'n', 0);
  } else if (strcmp(s, "nvswitch8-gpus8") == 0) {
    agoq_fake_build(agoq_fake_gpus8_buses, 's', 0);
  } else if (strcmp(s, "pairs") == 0) {
    agoq_fake_build(agoq_fake_hgx_buses, 'p', 0);
    agoq_fake_no_remote_type = 1;
  } else if (strcmp(s, "nodriver") == 0) {
    return AGOQ_FAKE_ERROR_DRIVER_NOT_LOADED;
  } else {
    fprintf(stderr, "fake-nvml: unknown AGOQ_FAKE_NVML_SCENARIO '%s'\n", s);
    return AGOQ_FAKE_ERROR_UNKNOWN;
  }
  agoq_fake_init_count = 1;
  return AGOQ_FAKE_SUCCESS;
}

AGOQ_FAKE_EXPORT agoq_fake_return nvmlShutdown(void) {
  if (agoq_fake_init_count == 0) return agoq_fake_misuse(AGOQ_FAKE_ERROR_UNINITIALIZED, "nvmlShutdown without init");
  agoq_fake_init_count--;
  return AGOQ_FAKE_SUCCESS;
}

AGOQ_FAKE_EXPORT const char* nvmlErrorString(agoq_fake_return rc) {
  switch (rc) {
    case AGOQ_FAKE_SUCCESS: return "Success";
    case AGOQ_FAKE_ERROR_UNINITIALIZED: return "Uninitialized";
    case AGOQ_FAKE_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case AGOQ_FAKE_ERROR_NOT_SUPPORTED: return "Not Supported";
    case AGOQ_FAKE_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case AGOQ_FAKE_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
  }
  return "Unknown Error";
}

AGOQ_FAKE_EXPORT agoq_fake_return nvmlDeviceGetCount_v2(unsigned* count) {
  agoq_fake_return rc = agoq_fake_check_init();
  if (rc != AGOQ_FAKE_SUCCESS) return rc;
  if (count == NULL) return agoq_fake_misuse(AGOQ_FAKE_ERROR_INVALID_ARGUMENT, "NULL count");
  *count = (unsigned)agoq_fake_ndevs;
  return AGOQ_FAKE_SUCCESS;
}

AGOQ_FAKE_EXPORT agoq_fake_return nvmlDeviceGetHandleByIndex_v2(unsigned index, agoq_fake_handle* dev) {
  agoq_fake_return rc = agoq_fake_check_init();
  if (rc != AGOQ_FAKE_SUCCESS) return rc;
  if (dev == NULL) return agoq_fake_misuse(AGOQ_FAKE_ERROR_INVALID_ARGUMENT, "NULL device");
  if (index >= (unsigned)agoq_fake_ndevs) return agoq_fake_misuse(AGOQ_FAKE_ERROR_INVALID_ARGUMENT, "index >= count");
  *dev = &agoq_fake_devs[index];
  return AGOQ_FAKE_SUCCESS;
}

AGOQ_FAKE_EXPORT agoq_fake_return nvmlDeviceGetPciInfo_v3(agoq_fake_handle dev, agoq_fake_pci_info* pci) {
  agoq_fake_return rc = agoq_fake_check_dev(dev);
  if (rc != AGOQ_FAKE_SUCCESS) return rc;
  if (pci == NULL) return agoq_fake_misuse(AGOQ_FAKE_ERROR_INVALID_ARGUMENT, "NULL pci");
  agoq_fake_pci(dev->domain, dev->bus, 0x233010deu, pci); /* H100 SXM5: 10de:2330 */
  return AGOQ_FAKE_SUCCESS;
}

AGOQ_FAKE_EXPORT agoq_fake_return nvmlDeviceGetNvLinkCapability(agoq_fake_handle dev, unsigned link, int cap,
                                                                 unsigned* result) {
  const agoq_fake_link* l = NULL;
  agoq_fake_return rc = agoq_fake_check_link(dev, link, result, &l);
  if (rc != AGOQ_FAKE_SUCCESS) return rc;
  if (cap < 0 || cap >= AGOQ_FAKE_CAP_COUNT) return AGOQ_FAKE_ERROR_INVALID_ARGUMENT;
  *result = cap == 0 || cap == 5 ? 1u : 0u; /* P2P_SUPPORTED and VALID on every link */
  return AGOQ_FAKE_SUCCESS;
}

AGOQ_FAKE_EXPORT agoq_fake_return nvmlDeviceGetNvLinkState(agoq_fake_handle dev, unsigned link, int* active) {
  const agoq_fake_link* l = NULL;
  agoq_fake_return rc = agoq_fake_check_link(dev, link, active, &l);
  if (rc != AGOQ_FAKE_SUCCESS) return rc;
  *active = l->active;
  return AGOQ_FAKE_SUCCESS;
}

AGOQ_FAKE_EXPORT agoq_fake_return nvmlDeviceGetNvLinkRemotePciInfo_v2(agoq_fake_handle dev, unsigned link,
                                                                      agoq_fake_pci_info* pci) {
  const agoq_fake_link* l = NULL;
  agoq_fake_return rc = agoq_fake_check_link(dev, link, pci, &l);
  if (rc != AGOQ_FAKE_SUCCESS) return rc;
  if (!l->active) return AGOQ_FAKE_ERROR_NOT_SUPPORTED; /* nothing at the end of a down link */
  if (l->remote_type == AGOQ_FAKE_DEV_SWITCH)
    agoq_fake_pci(0, agoq_fake_switch_buses[l->remote], 0x22a310deu, pci); /* NVSwitch: 10de:22a3 */
  else
    agoq_fake_pci(agoq_fake_devs[l->remote].domain, agoq_fake_devs[l->remote].bus, 0x233010deu, pci);
  return AGOQ_FAKE_SUCCESS;
}

AGOQ_FAKE_EXPORT agoq_fake_return nvmlDeviceGetNvLinkRemoteDeviceType(agoq_fake_handle dev, unsigned link, int* type) {
  const agoq_fake_link* l = NULL;
  agoq_fake_return rc = agoq_fake_check_link(dev, link, type, &l);
  if (rc != AGOQ_FAKE_SUCCESS) return rc;
  if (agoq_fake_no_remote_type) return AGOQ_FAKE_ERROR_FUNCTION_NOT_FOUND;
  if (!l->active) return AGOQ_FAKE_ERROR_NOT_SUPPORTED;
  *type = l->remote_type;
  return AGOQ_FAKE_SUCCESS;
}

/* For the tests: calls a correct caller never makes, and inits not yet shut down. */
AGOQ_FAKE_EXPORT int agoq_fake_nvml_misuse(void) { return agoq_fake_misuse_count; }
AGOQ_FAKE_EXPORT int agoq_fake_nvml_refcount(void) { return agoq_fake_init_count; }
AGOQ_FAKE_EXPORT void agoq_fake_nvml_reset(void) {
  agoq_fake_misuse_count = 0;
  agoq_fake_init_count = 0;
}
