/* The two-level CollNet schedule (issue 28, docs/design-collnet.md "Two levels"): who sends
 * which part of a pipeline chunk to whom at each step. Pure data and arithmetic: no I/O, no
 * NCCL types, no allocation on the enumeration paths; the engine, the simulation and the
 * tests all run these same functions.
 *
 * The n ranks of a group are laid out as a grid of b rows of a positions (rows: locality
 * domains, such as the nodes under one leaf switch; rank r at row r / a, column r % a). A
 * chunk is cut into a*b pieces at block granularity; piece (col c, row r) has index
 * c*b + r, so column c's b pieces are contiguous (its "column slice"). The rank playing
 * position (r, c) owns piece (c, r). Per chunk (an allreduce):
 *   1. ROW_RS: each rank quantizes its contribution once and sends column slice c to the
 *      player of (its row, c): a row reduce-scatter. That player sums its row's
 *      contributions in fp32, in rank order.
 *   2. COL_RS: each player of (R, c) sends piece (c, r) of that fp32 row sum to the player of
 *      (r, c): a column reduce-scatter of fp32 partial sums (no second quantization). The
 *      player of (r, c) sums the b row sums in fp32, in row order, and quantizes once.
 *   3. COL_AG: each player of (r, c) sends its final piece (c, r) to the other players of
 *      column c: every player of (R, c) then holds column slice c, final.
 *   4. ROW_AG: each rank sends the column slices it holds as one message to each other rank
 *      of its row: every rank then holds every piece, final, bits identical everywhere.
 * Each contribution is quantized once and the fp32 sum once, as on the one-level mesh, so the
 * error does not grow with n; only the fp32 summation order changes (row, then column).
 *
 * A short last row (n not a multiple of a; prime n) has `last` ranks: its missing positions
 * (b-1, c >= last) are played by rank a*(b-1) + c % last, a rank of that row, which then
 * plays several columns. With b == 1 the grid is the one-level mesh (a == n): COL_RS and
 * COL_AG are empty and ROW_RS/ROW_AG are today's two phases. */
#ifndef AGOQ_COLL_SCHEDULE_H
#define AGOQ_COLL_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>

/* Up to this many ranks the automatic choice is the one-level mesh. A grid of more than one
 * row has at most AGOQ_COLL_GRID_COLS_MAX columns (a rank of a short last row plays up to
 * that many). */
enum { AGOQ_COLL_GRID_DIRECT_MAX = 16, AGOQ_COLL_GRID_COLS_MAX = 4096 };

typedef struct {
  int n;    /* ranks */
  int a;    /* positions per row (columns) */
  int b;    /* rows */
  int last; /* ranks in the last row, 1..a */
} agoq_coll_grid;

/* The grid of n ranks: a = b = 0 chooses (agoq_coll_grid_auto); otherwise a columns and b
 * rows with a*(b-1) < n <= a*b (b == 1 needs a == n; b > 1, a <= AGOQ_COLL_GRID_COLS_MAX).
 * 0, or -1 with why filled. */
int agoq_coll_grid_make(int n, int a, int b, agoq_coll_grid* g, char* why, size_t why_len);
/* The automatic choice for n ranks, the same on every rank (n alone decides): the one-level
 * mesh up to AGOQ_COLL_GRID_DIRECT_MAX; else a = the least divisor of n from ceil(sqrt(n)) to
 * 2*sqrt(n) (an exact grid, a >= b); else a = ceil(sqrt(n)) with a short last row. */
void agoq_coll_grid_auto(int n, agoq_coll_grid* g);
/* AGOQ_COLLNET_CHUNK=auto on grid g: the pipeline chunk in input bytes, the same on every
 * rank. A chunk costs every rank the schedule's messages (2(a+b-2) on a grid) whatever its
 * size, so a grid takes the largest call NCCL makes at its default NCCL_BUFFSIZE (4 MiB):
 * CollNetDirect's calls of NCCL_BUFFSIZE, and the CollNetChain calls agoq's tuner asks for
 * large messages (getChunkSize: 8 chunks of NCCL_BUFFSIZE/8), so that one call is one chunk
 * and pays the messages once; NCCL's own 2 MiB CollNetChain calls are one chunk of 2 MiB (a
 * chunk never joins two calls, and slots grow only to the chunks they carry). The one-level
 * mesh keeps 1 MiB, because it is where the GPU data path runs, whose pinned frames are sized
 * for the worst case per chunk (docs/design-collnet.md). */
enum { AGOQ_COLL_CHUNK_MESH = 1 << 20, AGOQ_COLL_CHUNK_GRID = 4 << 20 };
size_t agoq_coll_chunk_auto(const agoq_coll_grid* g);

static inline int agoq_coll_grid_row(const agoq_coll_grid* g, int rank) { return rank / g->a; }
static inline int agoq_coll_grid_col(const agoq_coll_grid* g, int rank) { return rank % g->a; }
/* Ranks in row `row`. */
static inline int agoq_coll_grid_row_len(const agoq_coll_grid* g, int row) {
  return row == g->b - 1 ? g->last : g->a;
}
/* The rank that plays position (row, col). */
int agoq_coll_grid_player(const agoq_coll_grid* g, int row, int col);
/* The columns `rank` plays, ascending, into cols[] (room for a entries); returns how many:
 * one in a full row, ceil((a - j) / last) for rank j of a short last row. */
int agoq_coll_grid_cols_of(const agoq_coll_grid* g, int rank, int* cols);
/* AGOQ_COLLNET_GRID's text: "auto" (*a = *b = 0) or "AxB" (A columns, B rows, each 1 to
 * 65535; 'x' or 'X', blanks around the numbers allowed). 0, or -1 with why filled. Whether
 * the grid holds the group is agoq_coll_grid_make's question, at group creation. */
int agoq_coll_grid_parse(const char* text, int* a, int* b, char* why, size_t why_len);
/* The grid as a user writes it: "AxB", or "auto" for a = b = 0. */
void agoq_coll_grid_text(int a, int b, char* buf, size_t len);
/* Whether `rank` plays column `col` in its row. */
static inline bool agoq_coll_grid_plays(const agoq_coll_grid* g, int rank, int col) {
  return agoq_coll_grid_player(g, agoq_coll_grid_row(g, rank), col) == rank;
}
/* Pieces of a chunk: a*b. Piece (col, row)'s index. */
static inline int agoq_coll_grid_pieces(const agoq_coll_grid* g) { return g->a * g->b; }
static inline int agoq_coll_grid_piece(const agoq_coll_grid* g, int col, int row) { return col * g->b + row; }

typedef enum {
  AGOQ_COLL_ROW_RS = 0,
  AGOQ_COLL_COL_RS,
  AGOQ_COLL_COL_AG,
  AGOQ_COLL_ROW_AG,
  AGOQ_COLL_STEPS
} agoq_coll_step;

const char* agoq_coll_step_name(agoq_coll_step s);

/* Pieces [row, row + rows) of column `col`: pieces col*b + row ... */
typedef struct {
  int col, row, rows;
} agoq_coll_span;

/* One message of one step: from, to, and what it carries, in this order on the wire
 * (spans[0..nspans); the spans point into the enumerator's storage, valid during the call). */
typedef struct {
  agoq_coll_step step;
  int from, to;
  int nspans;
  const agoq_coll_span* spans;
} agoq_coll_msg;

typedef void (*agoq_coll_msg_fn)(void* arg, const agoq_coll_msg* m);

/* Every message `rank` sends in `step` of one chunk, by destination rank ascending; spans[]
 * needs room for a spans (the most one message can carry). What a rank keeps for itself
 * (a position it plays) is no message. */
void agoq_coll_schedule_sends(const agoq_coll_grid* g, int rank, agoq_coll_step step, agoq_coll_span* spans,
                              agoq_coll_msg_fn fn, void* arg);
/* Every message `rank` receives in `step`, by sender ascending (the senders' own
 * enumeration, filtered). spans[] as above. */
void agoq_coll_schedule_recvs(const agoq_coll_grid* g, int rank, agoq_coll_step step, agoq_coll_span* spans,
                              agoq_coll_msg_fn fn, void* arg);

/* The peers `rank` exchanges messages with at all (sends or receives, any step), counted
 * once each: the connections it needs. */
int agoq_coll_schedule_peers(const agoq_coll_grid* g, int rank);
/* Whether `rank` and `p` exchange messages (symmetric; false for p == rank). */
bool agoq_coll_schedule_is_peer(const agoq_coll_grid* g, int rank, int p);

#endif
