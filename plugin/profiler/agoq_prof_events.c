/* Event handlers: what each start records, how a child finds and checks its parent, and
 * stop. Called by NCCL from the user thread (tasks) and from proxy threads (ops, steps and
 * the net plugin's events), concurrently; everything shared is in the pools' atomics. */
#include <string.h>

#include "core/agoq_log.h"
#include "profiler/agoq_prof.h"
#include "profiler/agoq_prof_api.h"

/* Coll handles: one static byte per (protocol, datatype + 1). The address says what a
 * ProxyOp under the collective needs to know, without an object to allocate or free. */
static char agoq_prof_coll_tags[AGOQ_XFER_PROTO_LL128 + 1][ncclNumTypes + 1];
/* The handle of a NetPlugin event whose descriptor was ours (filled or not). */
static char agoq_prof_net_tag;
/* Handles of p2p tasks agoq will never quantize but whose reason is known: one static byte
 * per (protocol, datatype, direction). The tag is handed down unchanged as the ProxyOp's
 * and ProxyStep's handle, so the net event can say "LL" or "integer" instead of "unknown"
 * (the reason in AGOQ_STATS) without a pool object. No tag is ever made for a SIMPLE float
 * send: those are tracked objects with their peer checked, so a tag cannot lead to a
 * lossy transfer. */
static char agoq_prof_p2p_tags[AGOQ_XFER_PROTO_LL128 + 1][ncclNumTypes][2];

static void* agoq_prof_p2p_tag(const agoq_prof_info* info) {
  return &agoq_prof_p2p_tags[info->proto][info->dtype][info->is_send];
}

static bool agoq_prof_p2p_tag_decode(const void* h, agoq_prof_info* info) {
  uintptr_t off = (uintptr_t)h - (uintptr_t)&agoq_prof_p2p_tags[0][0][0];
  if (off >= sizeof agoq_prof_p2p_tags) return false;
  info->kind = AGOQ_XFER_P2P;
  info->is_send = (int)(off % 2);
  info->dtype = (int)(off / 2 % ncclNumTypes);
  info->proto = (agoq_xfer_proto)(off / 2 / ncclNumTypes);
  info->peer = -1;
  info->task_bytes = 0;
  return true;
}

static bool agoq_prof_coll_tag_decode(const void* h, agoq_prof_info* info) {
  uintptr_t off = (uintptr_t)h - (uintptr_t)&agoq_prof_coll_tags[0][0];
  if (off >= sizeof agoq_prof_coll_tags) return false;
  info->kind = AGOQ_XFER_COLL;
  info->proto = (agoq_xfer_proto)(off / (ncclNumTypes + 1));
  info->dtype = (int)(off % (ncclNumTypes + 1)) - 1;
  info->task_bytes = 0;
  return true;
}

void* agoq_prof_start_coll(void* ctx, const char* datatype, const char* proto) {
  (void)ctx;
  int dtype = agoq_prof_parse_dtype(datatype);
  return &agoq_prof_coll_tags[agoq_prof_parse_proto(proto)][dtype + 1];
}

/* The last AllReduce API calls of this thread (agoq_prof_api.h). Thread-local: written and
 * read on the user thread only, no sharing, nothing to free. */
#define AGOQ_PROF_API_RING 16
static _Thread_local struct {
  uint64_t comm_id;
  uint64_t bytes;
  int dtype_plus1; /* 0: empty */
} agoq_prof_api_ring[AGOQ_PROF_API_RING];
static _Thread_local unsigned agoq_prof_api_head;

void* agoq_prof_start_coll_api(void* ctx, const char* func, const char* datatype, size_t count) {
  const agoq_prof_ctx* c = agoq_prof_ctx_get(ctx);
  if (c == NULL || func == NULL || strcmp(func, "AllReduce") != 0) return NULL;
  int dtype = agoq_prof_parse_dtype(datatype);
  uint64_t bytes;
  if (dtype < 0 ||
      __builtin_mul_overflow((uint64_t)count, (uint64_t)agoq_prof_dtype_size(dtype), &bytes))
    return NULL;
  unsigned i = agoq_prof_api_head++ % AGOQ_PROF_API_RING;
  agoq_prof_api_ring[i].comm_id = c->comm_id;
  agoq_prof_api_ring[i].bytes = bytes;
  agoq_prof_api_ring[i].dtype_plus1 = dtype + 1;
  return NULL;
}

int agoq_prof_allreduce_take(uint64_t comm_id, uint64_t nbytes) {
  /* Newest first: for a call outside a group, NCCL asks the tuner right after its API
   * event. Inside a group an older call of the same size may answer; on agoq's CollNet that
   * is as true, since whether CollNet is available never depends on the type. Taken, so
   * that one API call answers one tuner call and no later one. */
  for (unsigned k = 1; k <= AGOQ_PROF_API_RING; k++) {
    unsigned i = (agoq_prof_api_head - k) % AGOQ_PROF_API_RING;
    int dtype = agoq_prof_api_ring[i].dtype_plus1 - 1;
    if (dtype >= 0 && agoq_prof_api_ring[i].comm_id == comm_id &&
        agoq_prof_api_ring[i].bytes == nbytes) {
      agoq_prof_api_ring[i].dtype_plus1 = 0;
      return dtype;
    }
  }
  return -1;
}

void* agoq_prof_start_p2p(void* ctx, const char* func, const char* datatype, size_t count,
                          int peer) {
  agoq_prof_ctx* c = agoq_prof_ctx_get(ctx);
  if (c == NULL) return NULL;
  agoq_prof_info info = {.kind = AGOQ_XFER_P2P, .peer = peer};
  info.is_send = agoq_prof_parse_p2p_func(func);
  info.dtype = agoq_prof_parse_dtype(datatype);
  /* A type we cannot name is not worth an object: its transfers are unknown (exact). */
  if (info.is_send < 0 || info.dtype < 0) return NULL;
  uint64_t bytes;
  if (__builtin_mul_overflow((uint64_t)count, (uint64_t)agoq_prof_dtype_size(info.dtype), &bytes))
    bytes = UINT64_MAX;
  info.task_bytes = bytes;
  info.proto = bytes <= agoq_prof_ll_limit() ? AGOQ_XFER_PROTO_LL : AGOQ_XFER_PROTO_SIMPLE;
  const bool quantizable_type =
      info.dtype == ncclFloat32 || info.dtype == ncclBfloat16 || info.dtype == ncclFloat16;
  /* AGOQ_P2P_SCOPE=pipeline: a receive that a quantizable send of the same shape could pair
   * with is remembered (agoq_prof_flows). Only those: other receives could never make a
   * send two-way, and would only push live flows out of the table. The receive of a group
   * may start after its send's task, but before that send's net event asks. */
  if (info.is_send == 0 && info.proto == AGOQ_XFER_PROTO_SIMPLE && quantizable_type) {
    uint64_t key;
    if (agoq_prof_flow_key(peer, info.dtype, bytes, &key)) agoq_prof_flow_record(&c->flows, key);
  }
  /* Only what the net side could quantize gets an object: a SIMPLE send of fp32, bf16 or
   * fp16. Everything else is exact whatever happens, so it gets a static tag instead: no
   * quarantined pool slot (agoq_prof.h) is spent on it, and its class still reaches the
   * net side as the reason it went exact. */
  if (info.is_send != 1 || info.proto != AGOQ_XFER_PROTO_SIMPLE || !quantizable_type)
    return agoq_prof_p2p_tag(&info);
  agoq_prof_obj* o = agoq_prof_pool_alloc(&c->pools[AGOQ_PROF_OBJ_P2P]);
  if (o == NULL) return NULL;
  agoq_prof_obj_publish(o, &info);
  return o;
}

void* agoq_prof_start_op(void* ctx, const void* parent, pid_t pid, int peer, int is_send) {
  /* Under PXN the op runs in a proxy of another process: its parent handle, and even the
   * context pointer, belong to that process. Check the pid before touching either. */
  if (parent == NULL || pid != agoq_prof_pid()) return NULL;
  agoq_prof_ctx* c = agoq_prof_ctx_get(ctx);
  if (c == NULL) return NULL;
  agoq_prof_info info;
  /* An exact p2p's tag names its steps too; a direction that does not match is a parent
   * we cannot vouch for (unknown). */
  if (agoq_prof_p2p_tag_decode(parent, &info)) return info.is_send == (is_send != 0) ? (void*)parent : NULL;
  if (agoq_prof_coll_tag_decode(parent, &info)) {
    info.peer = peer;
    info.is_send = is_send != 0;
  } else {
    const agoq_prof_obj* p = agoq_prof_pool_find(&c->pools[AGOQ_PROF_OBJ_P2P], parent);
    if (p == NULL || !agoq_prof_obj_read(p, &info)) return NULL;
    /* A recycled or mismatched parent shows here: the op must go to the task's peer in the
     * task's direction. */
    if (info.peer != peer || info.is_send != (is_send != 0)) return NULL;
  }
  agoq_prof_obj* o = agoq_prof_pool_alloc(&c->pools[AGOQ_PROF_OBJ_OP]);
  if (o == NULL) return NULL;
  agoq_prof_obj_publish(o, &info);
  return o;
}

void* agoq_prof_start_step(void* ctx, const void* parent) {
  if (parent == NULL) return NULL; /* op not tracked (PXN, unknown, pool full) */
  agoq_prof_ctx* c = agoq_prof_ctx_get(ctx);
  if (c == NULL) return NULL;
  agoq_prof_info info;
  if (agoq_prof_p2p_tag_decode(parent, &info)) return (void*)parent;
  const agoq_prof_obj* p = agoq_prof_pool_find(&c->pools[AGOQ_PROF_OBJ_OP], parent);
  if (p == NULL || !agoq_prof_obj_read(p, &info)) return NULL;
  agoq_prof_obj* o = agoq_prof_pool_alloc(&c->pools[AGOQ_PROF_OBJ_STEP]);
  if (o == NULL) return NULL;
  agoq_prof_obj_publish(o, &info);
  return o;
}

void* agoq_prof_start_net(void* ctx, const void* parent, int64_t plugin_id, void* data) {
  /* Another net plugin's event (IB, Socket, ...): its data is not ours to read. */
  if (plugin_id != AGOQ_PROF_NET_PLUGIN_ID || data == NULL) return NULL;
  agoq_xfer_desc* d = data;
  if (d->magic != AGOQ_XFER_DESC_MAGIC) return NULL;
  if (parent != NULL) {
    agoq_prof_info info;
    bool two_way = false;
    bool known = agoq_prof_p2p_tag_decode(parent, &info); /* address arithmetic: try it first */
    if (!known) {
      agoq_prof_ctx* c = agoq_prof_ctx_get(ctx);
      const agoq_prof_obj* p =
          c != NULL ? agoq_prof_pool_find(&c->pools[AGOQ_PROF_OBJ_STEP], parent) : NULL;
      known = p != NULL && agoq_prof_obj_read(p, &info);
      /* Asked now, at the send's net event, not when its task started: the receive of the
       * same group may have been started after the send's task. Only a tracked p2p send
       * (a step object of this context) can be two-way; a tag never is. */
      uint64_t key;
      if (known && info.kind == AGOQ_XFER_P2P && info.is_send == 1 &&
          agoq_prof_flow_key(info.peer, info.dtype, info.task_bytes, &key))
        two_way = agoq_prof_flow_seen(&c->flows, key);
    }
    if (known) {
      d->two_way = two_way ? 1u : 0u;
      d->kind = info.kind;
      d->dtype = info.dtype;
      d->proto = info.proto;
      d->is_send = info.is_send;
      d->peer = info.peer;
      d->task_bytes = info.task_bytes;
      d->filled = 1;
    }
  }
  return &agoq_prof_net_tag;
}

ncclResult_t agoq_prof_stop(void* handle) {
  if (handle == NULL || handle == &agoq_prof_net_tag) return ncclSuccess;
  agoq_prof_info ignored;
  if (agoq_prof_coll_tag_decode(handle, &ignored) || agoq_prof_p2p_tag_decode(handle, &ignored))
    return ncclSuccess;
  /* Every other handle NCCL can pass is one of our pool objects. */
  if (agoq_prof_obj_is_ours(handle)) agoq_prof_obj_release(handle);
  return ncclSuccess;
}
