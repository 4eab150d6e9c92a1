/*
 * Reads ncclNetProperties_vN_t of any version into agoq_view_props. Members a version
 * lacks keep the values NCCL's own compatibility adapter fills in for that version.
 */
#include <stdio.h>
#include <string.h>

#include "agoq_loader_internal.h"

static void agoq_view_props_defaults(agoq_view_props* out) {
  memset(out, 0, sizeof(*out));
  out->net_device_type = NCCL_NET_DEVICE_HOST;
  out->net_device_version = NCCL_NET_DEVICE_INVALID_VERSION;
  out->max_p2p_bytes = AGOQ_NCCL_MAX_NET_SIZE;
  out->max_coll_bytes = AGOQ_NCCL_MAX_COLLNET_SIZE;
  out->max_multi_request_size = 1;
  out->vdev_count = 1;
}

/* Members present in every version, in every version's order. */
#define AGOQ_VIEW_PROPS_COMMON(out, q)                                              \
  do {                                                                              \
    snprintf((out)->name, sizeof((out)->name), "%s", (q)->name ? (q)->name : "");   \
    (out)->has_pci_path = (q)->pciPath != NULL;                                     \
    if ((q)->pciPath != NULL)                                                       \
      snprintf((out)->pci_path, sizeof((out)->pci_path), "%s", (q)->pciPath);       \
    (out)->guid = (q)->guid;                                                        \
    (out)->ptr_support = (q)->ptrSupport;                                           \
    (out)->speed = (q)->speed;                                                      \
    (out)->port = (q)->port;                                                        \
    (out)->latency = (q)->latency;                                                  \
    (out)->max_comms = (q)->maxComms;                                               \
    (out)->max_recvs = (q)->maxRecvs;                                               \
  } while (0)

#define AGOQ_VIEW_PROPS_DEVICE(out, q)                    \
  do {                                                    \
    (out)->net_device_type = (int)(q)->netDeviceType;     \
    (out)->net_device_version = (q)->netDeviceVersion;    \
  } while (0)

/* v9 and later. */
#define AGOQ_VIEW_PROPS_SIZES(out, q)              \
  do {                                             \
    (out)->reg_is_global = (q)->regIsGlobal;       \
    (out)->force_flush = (q)->forceFlush;          \
    (out)->vdev_count = (q)->vProps.ndevs;         \
    (out)->max_p2p_bytes = (q)->maxP2pBytes;       \
    (out)->max_coll_bytes = (q)->maxCollBytes;     \
  } while (0)

/* Both table kinds put getProperties at the same place in the struct, but each version
 * is a distinct type; pick the member through the right one. */
#define AGOQ_VIEW_GETPROPS(N, q)                                                   \
  (is_coll ? AGOQ_VIEW_CALL(ncclCollNet_v##N##_t, &tv, getProperties, dev, q)      \
           : AGOQ_VIEW_CALL(ncclNet_v##N##_t, &tv, getProperties, dev, q))

ncclResult_t agoq_view_props_get(int version, int is_coll, const void* table, int dev,
                                 agoq_view_props* out) {
  const agoq_net_view tv = {.version = version, .table = table, .name = NULL};
  ncclResult_t res;
  agoq_view_props_defaults(out);
  switch (version) {
    case 6: {
      ncclNetProperties_v6_t q = {0};
      if ((res = AGOQ_VIEW_GETPROPS(6, &q)) != ncclSuccess) return res;
      AGOQ_VIEW_PROPS_COMMON(out, &q);
      return ncclSuccess;
    }
    case 7: {
      ncclNetProperties_v7_t q = {0};
      if ((res = AGOQ_VIEW_GETPROPS(7, &q)) != ncclSuccess) return res;
      AGOQ_VIEW_PROPS_COMMON(out, &q);
      AGOQ_VIEW_PROPS_DEVICE(out, &q);
      return ncclSuccess;
    }
    case 8: {
      ncclNetProperties_v8_t q = {0};
      if ((res = AGOQ_VIEW_GETPROPS(8, &q)) != ncclSuccess) return res;
      AGOQ_VIEW_PROPS_COMMON(out, &q);
      AGOQ_VIEW_PROPS_DEVICE(out, &q);
      out->reg_is_global = q.regIsGlobal;
      return ncclSuccess;
    }
    case 9:
    case 10: {
      ncclNetProperties_v9_t q = {0};
      res = version == 9 ? AGOQ_VIEW_GETPROPS(9, &q) : AGOQ_VIEW_GETPROPS(10, &q);
      if (res != ncclSuccess) return res;
      AGOQ_VIEW_PROPS_COMMON(out, &q);
      AGOQ_VIEW_PROPS_DEVICE(out, &q);
      AGOQ_VIEW_PROPS_SIZES(out, &q);
      return ncclSuccess;
    }
    case 11: {
      ncclNetProperties_v11_t q = {0};
      if ((res = AGOQ_VIEW_GETPROPS(11, &q)) != ncclSuccess) return res;
      AGOQ_VIEW_PROPS_COMMON(out, &q);
      AGOQ_VIEW_PROPS_DEVICE(out, &q);
      AGOQ_VIEW_PROPS_SIZES(out, &q);
      out->max_multi_request_size = q.maxMultiRequestSize;
      return ncclSuccess;
    }
    case 12: {
      ncclNetProperties_v12_t q = {0};
      if ((res = AGOQ_VIEW_GETPROPS(12, &q)) != ncclSuccess) return res;
      AGOQ_VIEW_PROPS_COMMON(out, &q);
      AGOQ_VIEW_PROPS_DEVICE(out, &q);
      AGOQ_VIEW_PROPS_SIZES(out, &q);
      out->max_multi_request_size = q.maxMultiRequestSize;
      return ncclSuccess;
    }
    default:
      return agoq_view_bad_version(version);
  }
}
