/*
 * What CollNet group creation reads from other ranks, as pure functions (unit-tested and
 * fuzzed by tests/fuzz/fuzz_collnet_msg.c):
 *  - the settings block every rank appends to its net handle ([64, 96) of NCCL's 128-byte
 *    handle), which must match this rank's byte for byte;
 *  - the 16-byte messages on every mesh connection: "ident" (rank, phase) first on each
 *    connection, "ready" closing setup.
 * The per-chunk messages of the collectives themselves carry no header of their own: they
 * are codec frames (agoq_frame_parse, fuzzed by fuzz_frame) or raw slices whose size the
 * engine checks against the layout before use.
 */
#ifndef AGOQ_COLL_WIRE_H
#define AGOQ_COLL_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "collnet/agoq_coll_internal.h"

#define AGOQ_COLL_HANDLE_MAGIC 0x4e514741u /* "AGQN" */
#define AGOQ_COLL_HANDLE_VERSION 1
#define AGOQ_COLL_HANDLE_OFFSET 64
#define AGOQ_COLL_SETTINGS_SIZE 32

#define AGOQ_COLL_MSG_MAGIC 0x49514741u /* "AGQI" */
#define AGOQ_COLL_MSG_SIZE 16
enum { AGOQ_COLL_MSG_IDENT = 1, AGOQ_COLL_MSG_READY = 2 };

typedef struct {
  int kind;
  uint32_t phase;
  uint32_t rank;
  uint32_t nranks;
} agoq_coll_msg;

typedef enum {
  AGOQ_COLL_SETTINGS_OK = 0,
  AGOQ_COLL_SETTINGS_FOREIGN,  /* not made by this version's CollNet listen */
  AGOQ_COLL_SETTINGS_MISMATCH, /* another rank runs with different settings */
} agoq_coll_settings_status;

void agoq_coll_settings_encode(const agoq_coll_config* cfg, uint8_t out[AGOQ_COLL_SETTINGS_SIZE]);
/* theirs: AGOQ_COLL_SETTINGS_SIZE bytes from another rank's handle; mine: ours. */
agoq_coll_settings_status agoq_coll_settings_check(const uint8_t* theirs, const uint8_t* mine);

void agoq_coll_msg_encode(uint8_t out[AGOQ_COLL_MSG_SIZE], int kind, int phase, int rank, int nranks);
/* True when `in` (size bytes as received) is a well-formed message of `kind`. */
bool agoq_coll_msg_decode(const uint8_t* in, size_t size, int kind, agoq_coll_msg* m);
/* True when an ident message names a peer of a group of nranks other than my_rank. */
bool agoq_coll_ident_valid(const agoq_coll_msg* m, int my_rank, int nranks);

#endif
