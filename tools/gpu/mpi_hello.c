/*
 * The MPI check tools/gpu-check.sh runs before it builds nccl-tests against an MPI: the
 * compiler wrapper works, the launcher starts every rank, and the ranks can do what
 * nccl-tests needs of MPI (broadcast rank 0's 128-byte ncclUniqueId, sum a count across
 * ranks, gather, and meet at a barrier). A runtime where PMIx or the launcher cannot work
 * fails here in seconds, with MPI's own words, instead of inside every benchmark.
 * Prints "mpi-hello: ok N ranks" on rank 0; exit 1 on any disagreement.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1, bad = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);

  unsigned char id[128];
  for (int i = 0; i < 128; i++) id[i] = rank == 0 ? (unsigned char)(i * 7 + 3) : 0;
  MPI_Bcast(id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  for (int i = 0; i < 128; i++) bad |= id[i] != (unsigned char)(i * 7 + 3);

  long long sum = 0, mine = rank;
  MPI_Allreduce(&mine, &sum, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  bad |= sum != (long long)n * (n - 1) / 2;

  int* ranks = calloc((size_t)n, sizeof(int));
  if (ranks == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Allgather(&rank, 1, MPI_INT, ranks, 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 0; r < n; r++) bad |= ranks[r] != r;
  free(ranks);

  int any_bad = 0;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) printf(any_bad ? "mpi-hello: ranks disagree\n" : "mpi-hello: ok %d ranks\n", n);
  MPI_Finalize();
  return any_bad ? 1 : 0;
}
