/*
 * What NCCL's CollApi profiler events told agoq's profiler about recent collective calls,
 * for the tuner in the same library. NCCL's tuner sees a collective's function and byte
 * count but no datatype and no reduction op (ncclTuner_v5/v6 getCollInfo); the CollApi
 * event (ncclProfiler_v5/v6 collApi: func, count, datatype; no op either) is started by
 * ncclEnqueueCheck -> taskAppend on the calling thread before NCCL groups the tasks and
 * asks the tuner at group end, on that same thread for blocking communicators. So the
 * profiler keeps the last few AllReduce calls per thread, and the tuner asks for the one
 * that matches its (communicator, bytes). No match (another profiler, a nonblocking
 * communicator whose group ends on NCCL's thread, aggregated tasks) means "unknown".
 */
#ifndef AGOQ_PROF_API_H
#define AGOQ_PROF_API_H

#include <stdint.h>

/* The ncclDataType_t of the newest of the last 16 AllReduce API calls on this thread that
 * was on the communicator `comm_id` and of exactly `nbytes` (count x type size), which is
 * then forgotten (one API call answers one tuner call); -1 when none matches. */
int agoq_prof_allreduce_take(uint64_t comm_id, uint64_t nbytes);

#endif
