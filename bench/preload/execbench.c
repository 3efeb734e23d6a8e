/* execbench: what one exec of a program costs with each preloaded library, measured the same way
 * on every machine (no hyperfine needed where none can be installed, such as the GPU machine).
 *
 *   execbench N ROUNDS PROGRAM VARIANT...
 *
 * A VARIANT is an LD_PRELOAD value (several libraries separated by spaces), or "-" for none,
 * optionally followed by "|NAME=VALUE" pieces: more variables for that variant's environment. In
 * each round the variants take turns exec by exec (A B C A B C ...), so that drift hits them all
 * alike; each exec is posix_spawn + waitpid of PROGRAM with an environment holding only
 * LD_PRELOAD (and the variant's variables), timed with CLOCK_MONOTONIC. 100 untimed warm-up execs per variant come first.
 * Output, one line per round and variant: "round R variant V median_ns M", V counting from 0.
 * Exit status 1 when an exec fails or exits non-zero. */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  long long x = *(const long long *)a, y = *(const long long *)b;
  return (x > y) - (x < y);
}

static int run(const char *program, char *const envp[]) {
  char *argv[] = {(char *)program, NULL};
  pid_t pid;
  if (posix_spawn(&pid, program, NULL, NULL, argv, envp) != 0) return -1;
  int status;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: execbench N ROUNDS PROGRAM VARIANT...\n");
    return 2;
  }
  long n = atol(argv[1]), rounds = atol(argv[2]);
  const char *program = argv[3];
  int variants = argc - 4;
  if (n < 1 || rounds < 1) {
    fprintf(stderr, "execbench: N and ROUNDS must be positive\n");
    return 2;
  }
  char ***envs = calloc(variants, sizeof *envs);
  long long **times = calloc(variants, sizeof *times);
  if (!envs || !times) return 2;
  for (int v = 0; v < variants; v++) {
    char *spec = strdup(argv[4 + v]);
    size_t pieces = 2;
    for (const char *c = spec; c && *c; c++) pieces += *c == '|';
    envs[v] = calloc(pieces, sizeof(char *));
    times[v] = calloc(n, sizeof(long long));
    if (!spec || !envs[v] || !times[v]) return 2;
    size_t k = 0;
    char *rest = spec;
    char *preload = strsep(&rest, "|");
    if (strcmp(preload, "-") != 0) {
      size_t len = strlen("LD_PRELOAD=") + strlen(preload) + 1;
      envs[v][k] = malloc(len);
      if (!envs[v][k]) return 2;
      snprintf(envs[v][k++], len, "LD_PRELOAD=%s", preload);
    }
    for (char *var; (var = strsep(&rest, "|")) != NULL;)
      if (*var) envs[v][k++] = var;
  }
  for (int w = 0; w < 100; w++)
    for (int v = 0; v < variants; v++)
      if (run(program, envs[v]) != 0) {
        fprintf(stderr, "execbench: %s with variant %d failed\n", program, v);
        return 1;
      }
  for (long r = 0; r < rounds; r++) {
    for (long i = 0; i < n; i++)
      for (int v = 0; v < variants; v++) {
        long long t0 = now_ns();
        if (run(program, envs[v]) != 0) {
          fprintf(stderr, "execbench: %s with variant %d failed\n", program, v);
          return 1;
        }
        times[v][i] = now_ns() - t0;
      }
    for (int v = 0; v < variants; v++) {
      qsort(times[v], n, sizeof(long long), cmp);
      printf("round %ld variant %d median_ns %lld\n", r + 1, v, times[v][n / 2]);
    }
    fflush(stdout);
  }
  return 0;
}
