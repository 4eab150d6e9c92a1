/*
 * Copies the core's version-neutral device properties into each ABI version's struct.
 * Each version extends the previous one, so the fill macros nest the same way.
 */
#include <stddef.h>
#include <string.h>

#include "core/agoq_check.h"
#include "net/agoq_net.h"
#include "tables/agoq_tables.h"

/* NCCL reads these structs through its own declarations; a drifted member would be
 * silent memory corruption, so pin the LP64 layout (checked against NCCL's headers). */
#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(ncclNetProperties_v6_t) == 48, "ncclNetProperties_v6_t layout");
_Static_assert(sizeof(ncclNetProperties_v7_t) == 56, "ncclNetProperties_v7_t layout");
_Static_assert(sizeof(ncclNetProperties_v8_t) == 64, "ncclNetProperties_v8_t layout");
_Static_assert(sizeof(ncclNetProperties_v9_t) == 104, "ncclNetProperties_v9_t layout");
_Static_assert(sizeof(ncclNetProperties_v11_t) == 112, "ncclNetProperties_v11_t layout");
_Static_assert(sizeof(ncclNetProperties_v12_t) == 128, "ncclNetProperties_v12_t layout");
_Static_assert(offsetof(ncclNetProperties_v9_t, maxP2pBytes) == 88, "v9 maxP2pBytes");
_Static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104, "v11 tail");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104, "v12 vProps");
_Static_assert(offsetof(ncclNetProperties_v12_t, planeId) == 126, "v12 tail");
_Static_assert(sizeof(ncclNet_v6_t) == 136 && sizeof(ncclNet_v7_t) == 152 &&
                   sizeof(ncclNet_v8_t) == 152 && sizeof(ncclNet_v9_t) == 160 &&
                   sizeof(ncclNet_v10_t) == 160 && sizeof(ncclNet_v11_t) == 176 &&
                   sizeof(ncclNet_v12_t) == 176,
               "ncclNet_vN_t layout");
_Static_assert(sizeof(ncclCollNet_v6_t) == 120 && sizeof(ncclCollNet_v7_t) == 120 &&
                   sizeof(ncclCollNet_v8_t) == 136 && sizeof(ncclCollNet_v9_t) == 144 &&
                   sizeof(ncclCollNet_v11_t) == 152 && sizeof(ncclCollNet_v12_t) == 152,
               "ncclCollNet_vN_t layout");
_Static_assert(sizeof(ncclNetAttr_v11_t) == 44 && sizeof(ncclNetSGE_v8_t) == 24 &&
                   sizeof(ncclNetDeviceHandle_v7_t) == 32,
               "ncclNet auxiliary layouts");
#endif

/* NCCL never writes through name/pciPath; its structs simply predate const. */
#define AGOQ_PROPS_FILL_V6(d, s)        \
  do {                                  \
    (d)->name = (char*)(s)->name;       \
    (d)->pciPath = (char*)(s)->pci_path; \
    (d)->guid = (s)->guid;              \
    (d)->ptrSupport = (s)->ptr_support; \
    (d)->speed = (s)->speed_mbps;       \
    (d)->port = (s)->port;              \
    (d)->latency = (s)->latency_us;     \
    (d)->maxComms = (s)->max_comms;     \
    (d)->maxRecvs = (s)->max_recvs;     \
  } while (0)

#define AGOQ_PROPS_FILL_V7(d, s)                                       \
  do {                                                                 \
    AGOQ_PROPS_FILL_V6(d, s);                                          \
    (d)->netDeviceType = (ncclNetDeviceType)(s)->net_device_type;      \
    (d)->netDeviceVersion = (s)->net_device_version;                   \
  } while (0)

#define AGOQ_PROPS_FILL_V8(d, s)            \
  do {                                      \
    AGOQ_PROPS_FILL_V7(d, s);               \
    (d)->regIsGlobal = (s)->reg_is_global;  \
  } while (0)

/* vProps is filled separately: its capacity differs between v9..v11 and v12. */
#define AGOQ_PROPS_FILL_V9(d, s)              \
  do {                                        \
    AGOQ_PROPS_FILL_V8(d, s);                 \
    (d)->forceFlush = (s)->force_flush;       \
    (d)->maxP2pBytes = (s)->max_p2p_bytes;    \
    (d)->maxCollBytes = (s)->max_coll_bytes;  \
  } while (0)

#define AGOQ_PROPS_FILL_V11(d, s)                             \
  do {                                                        \
    AGOQ_PROPS_FILL_V9(d, s);                                 \
    (d)->maxMultiRequestSize = (s)->max_multi_request_size;   \
  } while (0)

static ncclResult_t agoq_props_fetch(int dev, void* out, size_t out_size, agoq_net_props* p) {
  if (out == NULL) {
    AGOQ_WARN("getProperties(dev %d): NULL properties", dev);
    return ncclInternalError;
  }
  /* Members a version lacks in the core's view still start zeroed, never stale. */
  memset(out, 0, out_size);
  memset(p, 0, sizeof(*p));
  return agoq_net_get_properties(dev, p);
}

/* cap never exceeds the core's array, so the copy below stays in bounds. */
_Static_assert(AGOQ_NCCL_NET_MAX_DEVS_PER_NIC_V12 <= AGOQ_NET_MAX_VDEVS, "vdev capacity");

static ncclResult_t agoq_props_vdevs(int dev, const agoq_net_props* p, int cap, int* ndevs,
                                     int* devs) {
  if (p->vdev_count < 0 || p->vdev_count > cap) {
    AGOQ_WARN("dev %d: %d fused devices do not fit this ABI version (max %d)", dev,
              p->vdev_count, cap);
    return ncclInternalError;
  }
  *ndevs = p->vdev_count;
  memcpy(devs, p->vdevs, (size_t)p->vdev_count * sizeof(int));
  return ncclSuccess;
}

ncclResult_t agoq_props_get_v6(int dev, ncclNetProperties_v6_t* props) {
  agoq_net_props p;
  AGOQ_CHECK(agoq_props_fetch(dev, props, sizeof(*props), &p));
  AGOQ_PROPS_FILL_V6(props, &p);
  return ncclSuccess;
}

ncclResult_t agoq_props_get_v7(int dev, ncclNetProperties_v7_t* props) {
  agoq_net_props p;
  AGOQ_CHECK(agoq_props_fetch(dev, props, sizeof(*props), &p));
  AGOQ_PROPS_FILL_V7(props, &p);
  return ncclSuccess;
}

ncclResult_t agoq_props_get_v8(int dev, ncclNetProperties_v8_t* props) {
  agoq_net_props p;
  AGOQ_CHECK(agoq_props_fetch(dev, props, sizeof(*props), &p));
  AGOQ_PROPS_FILL_V8(props, &p);
  return ncclSuccess;
}

ncclResult_t agoq_props_get_v9(int dev, ncclNetProperties_v9_t* props) {
  agoq_net_props p;
  AGOQ_CHECK(agoq_props_fetch(dev, props, sizeof(*props), &p));
  AGOQ_PROPS_FILL_V9(props, &p);
  return agoq_props_vdevs(dev, &p, AGOQ_NCCL_NET_MAX_DEVS_PER_NIC_V9, &props->vProps.ndevs,
                          props->vProps.devs);
}

ncclResult_t agoq_props_get_v11(int dev, ncclNetProperties_v11_t* props) {
  agoq_net_props p;
  AGOQ_CHECK(agoq_props_fetch(dev, props, sizeof(*props), &p));
  AGOQ_PROPS_FILL_V11(props, &p);
  return agoq_props_vdevs(dev, &p, AGOQ_NCCL_NET_MAX_DEVS_PER_NIC_V9, &props->vProps.ndevs,
                          props->vProps.devs);
}

ncclResult_t agoq_props_get_v12(int dev, ncclNetProperties_v12_t* props) {
  agoq_net_props p;
  AGOQ_CHECK(agoq_props_fetch(dev, props, sizeof(*props), &p));
  AGOQ_PROPS_FILL_V11(props, &p);
  props->railId = p.rail_id;
  props->planeId = p.plane_id;
  return agoq_props_vdevs(dev, &p, AGOQ_NCCL_NET_MAX_DEVS_PER_NIC_V12, &props->vProps.ndevs,
                          props->vProps.devs);
}
