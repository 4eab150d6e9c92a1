/* A fake sysfs tree for the topology tests: `root` is the test's temporary directory (each
 * test fills it with mkdtemp); mkdirs and put create directories and files below it.
 * Include after <cmocka.h>. */
#ifndef AGOQ_TOPO_TREE_H
#define AGOQ_TOPO_TREE_H

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static char root[64];

static void mkdirs(const char* rel) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  for (char* p = path + strlen(root) + 1; *p != '\0'; p++) {
    if (*p != '/') continue;
    *p = '\0';
    mkdir(path, 0700);
    *p = '/';
  }
  mkdir(path, 0700);
}

static void put(const char* rel, const char* text) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

#endif
