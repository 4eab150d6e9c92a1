/* NCCL's profiler plumbing, emulated (see agoq_nccl_emul.h). The comments name the NCCL
 * 2.28.9 function each piece stands for. */
#include "agoq_nccl_emul.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/agoq_nccl_profiler_v6.h"
#include "core/agoq_log.h"

struct agoq_emul_comm {
  int version; /* 5 or 6; 0: no profiler */
  const ncclProfiler_v5_t* v5;
  const ncclProfiler_v6_t* v6;
  void* ctx;
  int mask; /* ncclProfilerEventMask, as init set it */
  ncclResult_t init_res;
  int nranks, rank;
};

struct agoq_emul_task {
  agoq_emul_comm* comm;
  bool p2p;
  bool send;
  int peer;
  int mask; /* eActivationMask sampled at enqueue */
  void* handle;
  bool running;
};

/* NCCL's struct ncclProxyEventHandle: the phandle the net plugin gets. */
typedef struct {
  void* step_handle;
  agoq_emul_op* sub;
} agoq_emul_phandle;

/* NCCL's ncclProxySubArgs, as far as the profiler sees it. */
struct agoq_emul_op {
  agoq_emul_comm* comm;
  void* ctx;
  int mask;
  void* handle;
  agoq_emul_phandle ph[AGOQ_EMUL_NCCL_STEPS];
};

/* One event, version-neutral; filled into the table's own descriptor type. */
typedef struct {
  uint64_t type;
  void* parent;
  const char* func;
  const char* datatype;
  size_t count;
  int peer;
  int nchannels;
  const char* algo;
  const char* proto;
  pid_t pid;
  int channel, nsteps, chunk, is_send, step;
  int64_t net_id;
  void* net_data;
} agoq_emul_event;

/* The two descriptor types share member names, so one fill serves both. */
#define AGOQ_EMUL_FILL(d, ev, rank_)                               \
  do {                                                             \
    memset(&(d), 0, sizeof(d));                                    \
    (d).type = (ev)->type;                                         \
    (d).parentObj = (ev)->parent;                                  \
    (d).rank = (rank_);                                            \
    switch ((ev)->type) {                                          \
      case ncclProfileColl:                                        \
        (d).coll.func = (ev)->func;                                \
        (d).coll.count = (ev)->count;                              \
        (d).coll.datatype = (ev)->datatype;                        \
        (d).coll.nChannels = (uint8_t)(ev)->nchannels;             \
        (d).coll.algo = (ev)->algo;                                \
        (d).coll.proto = (ev)->proto;                              \
        break;                                                     \
      case ncclProfileP2p:                                         \
        (d).p2p.func = (ev)->func;                                 \
        (d).p2p.datatype = (ev)->datatype;                         \
        (d).p2p.count = (ev)->count;                               \
        (d).p2p.peer = (ev)->peer;                                 \
        (d).p2p.nChannels = (uint8_t)(ev)->nchannels;              \
        break;                                                     \
      case ncclProfileProxyOp:                                     \
        (d).proxyOp.pid = (ev)->pid;                               \
        (d).proxyOp.channelId = (uint8_t)(ev)->channel;            \
        (d).proxyOp.peer = (ev)->peer;                             \
        (d).proxyOp.nSteps = (ev)->nsteps;                         \
        (d).proxyOp.chunkSize = (ev)->chunk;                       \
        (d).proxyOp.isSend = (ev)->is_send;                        \
        break;                                                     \
      case ncclProfileProxyStep:                                   \
        (d).proxyStep.step = (ev)->step;                           \
        break;                                                     \
      case ncclProfileNetPlugin:                                   \
        (d).netPlugin.id = (ev)->net_id;                           \
        (d).netPlugin.data = (ev)->net_data;                       \
        break;                                                     \
      default:                                                     \
        break;                                                     \
    }                                                              \
  } while (0)

static void agoq_emul_start(const agoq_emul_comm* comm, void* ctx, void** handle,
                            const agoq_emul_event* ev) {
  if (comm->version == 5) {
    ncclProfilerEventDescr_v5_t d;
    AGOQ_EMUL_FILL(d, ev, comm->rank);
    (void)comm->v5->startEvent(ctx, handle, &d);
  } else {
    ncclProfilerEventDescr_v6_t d;
    AGOQ_EMUL_FILL(d, ev, comm->rank);
    (void)comm->v6->startEvent(ctx, handle, &d);
  }
}

static void agoq_emul_stop(const agoq_emul_comm* comm, void* handle) {
  if (comm->version == 5)
    (void)comm->v5->stopEvent(handle);
  else
    (void)comm->v6->stopEvent(handle);
}

static void agoq_emul_record(const agoq_emul_comm* comm, void* handle, int state,
                             ncclProfilerEventStateArgs_v5_t* args) {
  if (comm->version == 5)
    (void)comm->v5->recordEventState(handle, (ncclProfilerEventState_v5_t)state, args);
  else
    (void)comm->v6->recordEventState(handle, (ncclProfilerEventState_v6_t)state, args);
}

const char* agoq_emul_dtype_string(int dtype) {
  /* ncclDatatypeToString of 2.28.9, including its missing ncclUint8 case. */
  static const char* const names[ncclNumTypes] = {
      [ncclInt8] = "ncclInt8",         [ncclUint8] = "Unknown",
      [ncclInt32] = "ncclInt32",       [ncclUint32] = "ncclUint32",
      [ncclInt64] = "ncclInt64",       [ncclUint64] = "ncclUint64",
      [ncclFloat16] = "ncclFloat16",   [ncclFloat32] = "ncclFloat32",
      [ncclFloat64] = "ncclFloat64",   [ncclBfloat16] = "ncclBfloat16",
      [ncclFloat8e4m3] = "ncclFloat8e4m3", [ncclFloat8e5m2] = "ncclFloat8e5m2",
  };
  return dtype >= 0 && dtype < ncclNumTypes ? names[dtype] : "Unknown";
}

/* ---- communicator: ncclProfilerPluginInit / Finalize ---- */

/* The logger handed to the profiler's init, as NCCL hands it the same one as the net's. */
static ncclDebugLogger_t agoq_emul_logger = agoq_log_stderr;
void agoq_emul_set_logger(ncclDebugLogger_t log) { agoq_emul_logger = log != NULL ? log : agoq_log_stderr; }

agoq_emul_comm* agoq_emul_comm_create(const void* profiler_table, int version, uint64_t comm_id,
                                      int nranks, int rank) {
  if (profiler_table != NULL && version != 5 && version != 6) return NULL;
  agoq_emul_comm* c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->nranks = nranks;
  c->rank = rank;
  c->init_res = ncclSuccess;
  if (profiler_table == NULL) return c;
  c->version = version;
  if (version == 5) {
    c->v5 = profiler_table;
    c->init_res = c->v5->init(&c->ctx, comm_id, &c->mask, "agoq-emul", 1, nranks, rank,
                              agoq_emul_logger);
  } else {
    c->v6 = profiler_table;
    c->init_res = c->v6->init(&c->ctx, comm_id, &c->mask, "agoq-emul", 1, nranks, rank,
                              agoq_emul_logger);
  }
  /* NCCL only logs a failed init and keeps calling the profiler (with a NULL context). */
  if (c->init_res != ncclSuccess) c->ctx = NULL;
  return c;
}

void agoq_emul_comm_destroy(agoq_emul_comm* comm) {
  if (comm == NULL) return;
  if (comm->version == 5 && comm->ctx != NULL) (void)comm->v5->finalize(comm->ctx);
  if (comm->version == 6 && comm->ctx != NULL) (void)comm->v6->finalize(comm->ctx);
  free(comm);
}

ncclResult_t agoq_emul_comm_init_result(const agoq_emul_comm* comm) { return comm->init_res; }
int agoq_emul_comm_mask(const agoq_emul_comm* comm) { return comm->mask; }
void* agoq_emul_comm_context(const agoq_emul_comm* comm) { return comm->ctx; }

/* ---- tasks: ncclProfilerStartTaskEvents / StopTaskEvents ---- */

static agoq_emul_task* agoq_emul_task_new(agoq_emul_comm* comm, const agoq_emul_event* ev,
                                          bool p2p, bool send, int peer) {
  agoq_emul_task* t = calloc(1, sizeof *t);
  if (t == NULL) return NULL;
  t->comm = comm;
  t->p2p = p2p;
  t->send = send;
  t->peer = peer;
  /* ncclProfilerApiState.eActivationMask, sampled when the task is enqueued. */
  t->mask = __atomic_load_n(&comm->mask, __ATOMIC_RELAXED);
  int enable = t->mask & ((p2p ? ncclProfileP2p : ncclProfileColl) | ncclProfileProxyOp |
                          ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin);
  if (comm->version != 0 && enable) {
    agoq_emul_start(comm, comm->ctx, &t->handle, ev);
    t->running = true;
  }
  return t;
}

agoq_emul_task* agoq_emul_p2p_start_str(agoq_emul_comm* comm, const char* func,
                                        const char* datatype, size_t count, int peer,
                                        int nchannels) {
  agoq_emul_event ev = {.type = ncclProfileP2p,
                        .func = func,
                        .datatype = datatype,
                        .count = count,
                        .peer = peer,
                        .nchannels = nchannels};
  return agoq_emul_task_new(comm, &ev, true, func != NULL && strcmp(func, "Send") == 0, peer);
}

agoq_emul_task* agoq_emul_p2p_start(agoq_emul_comm* comm, bool send, int dtype, size_t count,
                                    int peer, int nchannels) {
  return agoq_emul_p2p_start_str(comm, send ? "Send" : "Recv", agoq_emul_dtype_string(dtype),
                                 count, peer, nchannels);
}

agoq_emul_task* agoq_emul_coll_start(agoq_emul_comm* comm, const char* func, int dtype,
                                     size_t count, const char* algo, const char* proto) {
  agoq_emul_event ev = {.type = ncclProfileColl,
                        .func = func,
                        .datatype = agoq_emul_dtype_string(dtype),
                        .count = count,
                        .nchannels = 2,
                        .algo = algo,
                        .proto = proto};
  return agoq_emul_task_new(comm, &ev, false, true, (comm->rank + 1) % (comm->nranks > 0 ? comm->nranks : 1));
}

void* agoq_emul_task_handle(const agoq_emul_task* task) { return task->handle; }

void agoq_emul_task_stop(agoq_emul_task* task) {
  if (task == NULL || !task->running) return;
  task->running = false;
  if (task->handle != NULL) agoq_emul_stop(task->comm, task->handle);
  /* NCCL keeps the handle value in the proxy ops it already posted (taskEventHandle). */
}

void agoq_emul_task_free(agoq_emul_task* task) {
  if (task == NULL) return;
  agoq_emul_task_stop(task);
  free(task);
}

/* ---- proxy ops and steps: ncclProfilerStart/StopProxyOpEvent, ...ProxyStepEvent ---- */

agoq_emul_op* agoq_emul_op_start_ex(agoq_emul_task* task, const agoq_emul_op_args* a) {
  agoq_emul_op* op = calloc(1, sizeof *op);
  if (op == NULL) return NULL;
  agoq_emul_comm* comm = task->comm;
  op->comm = comm;
  op->ctx = comm->ctx;
  op->mask = task->mask;
  for (int s = 0; s < AGOQ_EMUL_NCCL_STEPS; s++) op->ph[s].sub = op;
  if (comm->version != 0 &&
      (op->mask & (ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileNetPlugin))) {
    agoq_emul_event ev = {.type = ncclProfileProxyOp,
                          .parent = a->override_parent ? a->parent : task->handle,
                          .pid = a->pid != 0 ? a->pid : getpid(),
                          .channel = a->channel,
                          .peer = a->peer,
                          .nsteps = a->nsteps,
                          .chunk = a->chunk,
                          .is_send = a->is_send};
    agoq_emul_start(comm, op->ctx, &op->handle, &ev);
  }
  return op;
}

agoq_emul_op* agoq_emul_op_start(agoq_emul_task* task, int channel, int nsteps, int chunk) {
  agoq_emul_op_args a = {.channel = channel,
                         .nsteps = nsteps,
                         .chunk = chunk,
                         .peer = task->peer,
                         .is_send = task->send ? 1 : 0};
  return agoq_emul_op_start_ex(task, &a);
}

void* agoq_emul_op_handle(const agoq_emul_op* op) { return op->handle; }

void* agoq_emul_step_phandle(agoq_emul_op* op, int step) {
  agoq_emul_phandle* ph = &op->ph[step % AGOQ_EMUL_NCCL_STEPS];
  if (op->comm->version != 0 && (op->mask & (ncclProfileProxyStep | ncclProfileNetPlugin))) {
    agoq_emul_event ev = {.type = ncclProfileProxyStep, .parent = op->handle, .step = step};
    agoq_emul_start(op->comm, op->ctx, &ph->step_handle, &ev);
  }
  ph->sub = op;
  return ph;
}

void* agoq_emul_step_handle(const agoq_emul_op* op, int step) {
  return op->ph[step % AGOQ_EMUL_NCCL_STEPS].step_handle;
}

void agoq_emul_step_stop(agoq_emul_op* op, int step) {
  agoq_emul_phandle* ph = &op->ph[step % AGOQ_EMUL_NCCL_STEPS];
  if (op->comm->version != 0 && ph->step_handle != NULL) {
    agoq_emul_stop(op->comm, ph->step_handle);
    ph->step_handle = NULL;
  }
}

void agoq_emul_op_stop(agoq_emul_op* op) {
  if (op == NULL) return;
  for (int s = 0; s < AGOQ_EMUL_NCCL_STEPS; s++) agoq_emul_step_stop(op, s);
  if (op->comm->version != 0 && op->handle != NULL) agoq_emul_stop(op->comm, op->handle);
  free(op);
}

/* ---- ncclProfilerCallback ---- */

static ncclResult_t agoq_emul_profiler_callback(void** handle, int type, void* phandle,
                                                int64_t plugin_id, void* ext) {
  agoq_emul_phandle* p = phandle;
  agoq_emul_op* sub = p->sub;
  const agoq_emul_comm* comm = sub->comm;
  if (comm->version == 0) return ncclSuccess; /* no profiler loaded: a no-op */
  if (type == ncclProfilerNetEventStart) {
    if (sub->mask & ncclProfileNetPlugin) {
      agoq_emul_event ev = {.type = ncclProfileNetPlugin,
                            .parent = p->step_handle,
                            .net_id = plugin_id,
                            .net_data = ext};
      agoq_emul_start(comm, sub->ctx, handle, &ev);
    }
  } else if (type == ncclProfilerNetEventStop) {
    agoq_emul_stop(comm, *handle);
  } else {
    ncclProfilerEventStateArgs_v5_t args;
    memset(&args, 0, sizeof args);
    args.netPlugin.data = ext;
    agoq_emul_record(comm, *handle, ncclProfilerNetPluginUpdate, &args);
    if (type != ncclProfilerNetEventUpdate) agoq_emul_stop(comm, *handle);
  }
  return ncclSuccess;
}

ncclProfilerCallback_t agoq_emul_callback(void) { return agoq_emul_profiler_callback; }
