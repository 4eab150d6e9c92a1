/*
 * File descriptors against RLIMIT_NOFILE. Most distributions and containers start processes
 * with a soft limit of 1024 and a far higher hard one; a CollNet group holds one descriptor
 * per connection (2(n-1) per rank on the mesh, 2(a+b-2) on a grid), NCCL's own sockets and the application's come on top. The
 * soft limit is raised toward the hard one when a setup needs it (one INFO line), and where
 * even the hard one is short, the error names the limit, what is needed and how to raise it,
 * before any connection is tried: never a handshake timeout on some other rank.
 */
#ifndef AGOQ_FDLIMIT_H
#define AGOQ_FDLIMIT_H
#include <stdbool.h>
#include <stddef.h>

#include "abi/agoq_nccl_common.h"

/* Descriptors this process has open now (/proc/self/fd), 0 when that cannot be read. */
size_t agoq_fd_open_count(void);

/* Room for `need` more descriptors (plus a margin for NCCL and the application): raises the
 * soft limit when it is short and the hard one allows; else WARNs naming RLIMIT_NOFILE,
 * `what` (who needs them) and the figures, and returns ncclSystemError. */
ncclResult_t agoq_fd_reserve(size_t need, const char* what);

/* After a socket call failed with EMFILE: raises the soft limit toward the hard one (INFO)
 * and returns true when the call is worth trying again; false when the hard limit is reached
 * (the caller's error then names it: agoq_fd_exhausted_hint). */
bool agoq_fd_raise_after_emfile(void);

/* " (RLIMIT_NOFILE: soft S, hard H, N open: raise it with ulimit -n, LimitNOFILE= in a systemd
 * unit or --ulimit nofile= for a container)", for an EMFILE or ENFILE error message. */
const char* agoq_fd_exhausted_hint(char* buf, size_t len);

#endif
