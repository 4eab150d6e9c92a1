/*
 * What CollNet group creation reads from other ranks, as pure functions (unit-tested and
 * fuzzed by tests/fuzz/fuzz_collnet_msg.c):
 *  - the settings block every rank appends to its net handle ([64, 96) of NCCL's 128-byte
 *    handle), which must match this rank's byte for byte; it carries the values themselves
 *    (not a digest), so a mismatch can be reported variable by variable, both values shown;
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
#include "collnet/agoq_coll_io.h"

#define AGOQ_COLL_HANDLE_MAGIC 0x4e514741u /* "AGQN" */
/* 2: the grid (AGOQ_COLLNET_GRID) at bytes 24..27 and AGOQ_COLLNET_PARTIALS at 28.
 * 3: the same layout; one tagged connection per peer and direction (phase 0 only) instead of
 * one per phase. A peer of another version names both versions.
 * 4: the same settings; bytes [96, 128) carry the listening rank's own facts (the rank block:
 * its NIC's link rate), which differ between ranks and are not compared.
 * 5: AGOQ_COLLNET_IO_THREADS at byte 29 of the settings (the schedule's choice weighs it).
 * 6: the same layout; on a grid a quantized call's fp32 partial sums carry a CRC32C trailer
 *    (a version-5 peer's column messages would be 8 bytes short). */
#define AGOQ_COLL_HANDLE_VERSION 6
#define AGOQ_COLL_HANDLE_OFFSET 64
#define AGOQ_COLL_SETTINGS_SIZE 32
#define AGOQ_COLL_RANK_OFFSET 96
#define AGOQ_COLL_RANK_SIZE 32
/* The fastest link a rank block may name (100 Tbit/s): beyond it the block is corrupt. */
#define AGOQ_COLL_LINK_MBPS_MAX 100000000u

#define AGOQ_COLL_MSG_MAGIC 0x49514741u /* "AGQI" */
#define AGOQ_COLL_MSG_SIZE 16
enum { AGOQ_COLL_MSG_IDENT = 1, AGOQ_COLL_MSG_READY = 2 };

typedef struct {
  int kind;
  uint32_t phase;
  uint32_t rank;
  uint32_t nranks;
} agoq_coll_setup_msg;

typedef enum {
  AGOQ_COLL_SETTINGS_OK = 0,
  AGOQ_COLL_SETTINGS_FOREIGN,   /* no magic: not made by an agoq CollNet listen at all */
  AGOQ_COLL_SETTINGS_VERSION,   /* an agoq CollNet handle of another layout version */
  AGOQ_COLL_SETTINGS_MALFORMED, /* this version's magic but values no listen writes */
  AGOQ_COLL_SETTINGS_MISMATCH,  /* another rank runs with different settings */
} agoq_coll_settings_status;

/* The decoded settings block: the group-wide subset of agoq_coll_config. */
typedef struct {
  uint8_t version; /* layout version the block was written with */
  agoq_format format;
  uint32_t block;
  uint64_t min_bytes;
  uint64_t chunk_bytes;
  int grid_a, grid_b; /* 0 and 0: automatic */
  bool quant_partials;
  int io_threads;
} agoq_coll_settings;

void agoq_coll_settings_encode(const agoq_coll_config* cfg, uint8_t out[AGOQ_COLL_SETTINGS_SIZE]);
/* in: AGOQ_COLL_SETTINGS_SIZE bytes. OK only for a block this version's encode could have
 * written (known format, block a power of two in [32, 1024], zero padding); out->version
 * is set whenever the magic is there (VERSION names it in the error). */
agoq_coll_settings_status agoq_coll_settings_decode(const uint8_t* in, agoq_coll_settings* out);
/* theirs: AGOQ_COLL_SETTINGS_SIZE bytes from another rank's handle; mine: ours. OK exactly
 * when the two are byte-identical. */
agoq_coll_settings_status agoq_coll_settings_check(const uint8_t* theirs, const uint8_t* mine);
/* Writes into buf (always NUL-terminated when len > 0) the error for a peer whose decoded
 * settings differ from ours, naming every variable that differs with both values as a user
 * writes them, e.g. "CollNet group: rank 3 has AGOQ_FORMAT=int4, this rank (0) has
 * AGOQ_FORMAT=int8; every rank must use the same value". Returns how many variables
 * differ (0: nothing written but an empty string). */
int agoq_coll_settings_describe(const agoq_coll_settings* theirs, int their_rank, const agoq_coll_settings* mine,
                                int my_rank, char* buf, size_t len);

/* The rank block: this rank's link rate in Mbit/s (0: not known, the transport only guessed
 * it), which the automatic schedule weighs (agoq_coll_plans_pick). Rank blocks differ between
 * ranks, so they are read, never compared. */
void agoq_coll_rank_encode(uint32_t link_mbps, uint8_t out[AGOQ_COLL_RANK_SIZE]);
/* in: AGOQ_COLL_RANK_SIZE bytes of a handle whose settings block decoded OK. True for a block
 * this version's encode could have written (a rate up to AGOQ_COLL_LINK_MBPS_MAX, zero
 * padding), with *link_mbps set. */
bool agoq_coll_rank_decode(const uint8_t* in, uint32_t* link_mbps);
/* The group's link rate from every rank's handle (NCCL_NET_HANDLE_MAXSIZE bytes each): the
 * slowest rank's, so 0 when any rank's is not known. -1, or the first rank whose block does
 * not decode (*link_mbps then unset). */
int agoq_coll_rank_slowest(void* const* handles, int nranks, uint32_t* link_mbps);

void agoq_coll_msg_encode(uint8_t out[AGOQ_COLL_MSG_SIZE], int kind, int phase, int rank, int nranks);
/* True when `in` (size bytes as received) is a well-formed message of `kind`. */
bool agoq_coll_msg_decode(const uint8_t* in, size_t size, int kind, agoq_coll_setup_msg* m);
/* True when an ident message names a peer of a group of nranks other than my_rank. */
bool agoq_coll_ident_valid(const agoq_coll_setup_msg* m, int my_rank, int nranks);

#endif
