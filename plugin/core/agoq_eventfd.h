/*
 * Waking a thread that sleeps in poll(): an eventfd it polls for POLLIN. Its writers only
 * ever add 1 and its reader drains it after waking; both are non-blocking (EFD_NONBLOCK),
 * and a failed write can only mean the counter is already non-zero, i.e. the sleeper is
 * already being woken, so the result is ignored on purpose.
 */
#ifndef AGOQ_EVENTFD_H
#define AGOQ_EVENTFD_H

#include <stdint.h>
#include <unistd.h>

static inline void agoq_eventfd_post(int fd) {
  uint64_t one = 1;
  ssize_t ignored = write(fd, &one, sizeof one);
  (void)ignored;
}

static inline void agoq_eventfd_drain(int fd) {
  uint64_t count;
  ssize_t ignored = read(fd, &count, sizeof count);
  (void)ignored;
}

#endif
