/* AGOQ_TRANSPORT: which transport carries this process's connections; what the transports
 * share. */
#include <stdio.h>

#include "core/agoq_check.h"
#include "core/agoq_params.h"
#include "transport/agoq_transport.h"
#include "transport/ib/agoq_ib.h"

_Thread_local int agoq_tp_cpu_lane = -1;

void agoq_tp_props_defaults(agoq_tp_props* p, int dev) {
  memset(p, 0, sizeof *p);
  p->ptr_support = NCCL_PTR_HOST;
  p->max_recvs = AGOQ_XFER_MAX_BUFS;
  p->net_device_type = NCCL_NET_DEVICE_HOST;
  p->net_device_version = NCCL_NET_DEVICE_INVALID_VERSION;
  p->vdev_count = 1;
  p->vdevs[0] = dev;
  p->max_p2p_bytes = NCCL_MAX_NET_SIZE_BYTES;
  p->max_coll_bytes = AGOQ_NCCL_MAX_COLLNET_SIZE;
  p->max_multi_request_size = 1;
  p->rail_id = NCCL_NET_ID_UNDEF;
  p->plane_id = NCCL_NET_ID_UNDEF;
}

enum { AGOQ_TRANSPORT_AUTO = 0, AGOQ_TRANSPORT_TCP = 1, AGOQ_TRANSPORT_IB = 2 };

/* Written by agoq_transport_choose, which runs once per process under the net init's lock. */
static char agoq_transport_why[512];

const char* agoq_transport_reason(void) { return agoq_transport_why; }

static const agoq_transport* agoq_transport_forced;

void agoq_transport_override(const agoq_transport* tp) { agoq_transport_forced = tp; }

ncclResult_t agoq_transport_choose(const agoq_transport** out) {
  if (agoq_transport_forced != NULL) {
    AGOQ_CHECK(agoq_transport_forced->init());
    snprintf(agoq_transport_why, sizeof agoq_transport_why, "%s (in-process, set by the program)",
             agoq_transport_forced->name);
    *out = agoq_transport_forced;
    return ncclSuccess;
  }
  int64_t mode = agoq_param_int(AGOQ_PARAM_TRANSPORT);
  /* TCP first in every mode: it is the verbs transport's bootstrap, or the transport. */
  AGOQ_CHECK(agoq_transport_tcp.init());
  if (mode == AGOQ_TRANSPORT_TCP) {
    snprintf(agoq_transport_why, sizeof agoq_transport_why, "%s=tcp", agoq_param_source(AGOQ_PARAM_TRANSPORT));
    *out = &agoq_transport_tcp;
    return ncclSuccess;
  }
  char why[768];
  ncclResult_t res = agoq_ib_discover(&agoq_ib, NULL, NULL, why, sizeof why);
  if (res == ncclSuccess) {
    char line[1024] = "";
    for (int i = 0, len = 0; i < agoq_ib.ndevs && len < (int)sizeof line; i++) {
      const agoq_ib_dev* d = &agoq_ib.devs[i];
      int n = snprintf(line + len, sizeof line - (size_t)len, "%s[%d]%.64s/%s", i ? " " : "", i, d->describe,
                       d->link_layer == AGOQ_IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB");
      len += n > 0 ? n : 0;
    }
    AGOQ_INFO(NCCL_INIT | NCCL_NET, "Using verbs (%s, %s) on %s; %d queue pair%s per connection; bootstrap over TCP",
              agoq_param_str(AGOQ_PARAM_TRANSPORT), agoq_ib.api.path, line, agoq_ib.nqps, agoq_ib.nqps == 1 ? "" : "s");
    snprintf(agoq_transport_why, sizeof agoq_transport_why, "%.200s; bootstrap over TCP (AGOQ_TRANSPORT=%s)", line,
             agoq_param_str(AGOQ_PARAM_TRANSPORT));
    *out = &agoq_transport_ib;
    return ncclSuccess;
  }
  if (mode == AGOQ_TRANSPORT_IB || res == ncclInvalidArgument) {
    AGOQ_WARN("%s=%s: the verbs transport cannot be used: %s", agoq_param_source(AGOQ_PARAM_TRANSPORT),
              agoq_param_str(AGOQ_PARAM_TRANSPORT), why);
    return res == ncclInvalidArgument ? ncclInvalidArgument : ncclSystemError;
  }
  AGOQ_INFO(NCCL_INIT | NCCL_NET, "verbs transport off: %s; using TCP (AGOQ_TRANSPORT=auto)", why);
  snprintf(agoq_transport_why, sizeof agoq_transport_why, "verbs off: %.400s", why);
  *out = &agoq_transport_tcp;
  return ncclSuccess;
}
