/* The C ABI on the host: a C program against include/apm.h and libapm_capi.so, on the
 * simulated fabric. Built and run by apm-capi/tests/c_api.rs. Exit 0 on success. */
#include "apm.h"

#include <poll.h>
#include <stdio.h>
#include <string.h>

#define CHECK(cond, ...)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                   \
      fprintf(stderr, __VA_ARGS__);                                          \
      fprintf(stderr, " (apm_last_error: %s)\n", apm_last_error());          \
      return 1;                                                              \
    }                                                                        \
  } while (0)

static const char *CONFIG =
    "[[device]]\n"
    "name = \"h2\"\n"
    "provider = \"sim\"\n"
    "[sim]\n"
    "seed = 7\n";

static int callbacks;
static void on_note(const ApmNotification *n, void *user) {
  (void)n;
  *(int *)user += 1;
}

int main(void) {
  ApmManager *m = NULL;
  ApmStatus st;

  /* Errors are codes with a message. */
  st = apm_manager_new("/nonexistent/apm.toml", &m);
  CHECK(st == APM_STATUS_CONFIG && m == NULL, "missing file: %d", st);
  CHECK(strstr(apm_last_error(), "nonexistent") != NULL, "message names the file");
  st = apm_manager_new_from_str("[[device]]\nname = \"h2\"\nprovider = \"simulated\"\n", &m);
  CHECK(st == APM_STATUS_CONFIG, "bad provider: %d", st);
  CHECK(strstr(apm_last_error(), "line 3") != NULL, "message points at the line");
  st = apm_manager_new_from_str("[[device]]\nname = \"hca_absent\"\nprovider = \"verbs\"\n", &m);
  CHECK(st == APM_STATUS_UNAVAILABLE && m == NULL, "absent HCA: %d", st);
  CHECK(apm_manager_new_from_str(NULL, &m) == APM_STATUS_INVALID_ARGUMENT, "NULL config");

  st = apm_manager_new_from_str(CONFIG, &m);
  CHECK(st == APM_STATUS_OK && m != NULL, "create: %d", st);
  int fd = apm_notification_fd(m);
  CHECK(fd >= 0, "fd");

  size_t n = 0;
  CHECK(apm_sim_connection_count(m, &n) == APM_STATUS_OK && n > 0, "connections");
  ApmConnInfo first;
  for (size_t i = 0; i < n; i++) {
    ApmConnInfo info;
    CHECK(apm_sim_connection(m, i, &info) == APM_STATUS_OK, "connection %zu", i);
    if (i == 0) first = info;
    CHECK(apm_protect(m, NULL, &info) == APM_STATUS_OK, "protect %zu", i);
  }
  /* Protecting twice is the engine's error; a bad QPN is the caller's. */
  CHECK(apm_protect(m, NULL, &first) == APM_STATUS_ENGINE, "protect twice");
  ApmConnInfo bad = first;
  bad.id = 999999;
  bad.local_qpn = 0x1000000;
  CHECK(apm_protect(m, NULL, &bad) == APM_STATUS_INVALID_ARGUMENT, "25-bit QPN");
  CHECK(apm_protect(m, NULL, NULL) == APM_STATUS_INVALID_ARGUMENT, "NULL info");

  /* Rail A's switch dies at 0.5 s and returns at 2.5 s. */
  CHECK(apm_sim_run_for(m, 3000) == APM_STATUS_OK, "run");
  struct pollfd p = {.fd = fd, .events = POLLIN};
  CHECK(poll(&p, 1, 0) == 1 && (p.revents & POLLIN), "fd readable with notifications pending");
  int counts[6] = {0};
  int local_port = 0;
  ApmNotification note;
  while ((st = apm_next_notification(m, &note)) == APM_STATUS_OK) {
    CHECK(note.kind >= 1 && note.kind <= 5, "kind %d", (int)note.kind);
    counts[note.kind]++;
    CHECK(memchr(note.cause, 0, sizeof note.cause) != NULL, "cause NUL-terminated");
    if (note.kind == APM_NOTIFICATION_KIND_MIGRATED) {
      /* What this side saw kill the primary, or nothing when the peer asked. */
      CHECK(strcmp(note.cause, "local_port") == 0 || strcmp(note.cause, "peer_port") == 0 ||
                note.cause[0] == 0,
            "cause of a move on a rail's switch dying: \"%s\"", note.cause);
      local_port += strcmp(note.cause, "local_port") == 0;
    } else if (note.kind != APM_NOTIFICATION_KIND_UNPROTECTED) {
      CHECK(note.cause[0] == 0, "no cause on kind %d", (int)note.kind);
    }
  }
  CHECK(st == APM_STATUS_AGAIN, "drained: %d", st);
  CHECK(poll(&p, 1, 0) == 0, "fd quiet once drained");
  printf("protected %d rearmed %d migrated %d unprotected %d lost %d\n",
         counts[APM_NOTIFICATION_KIND_PROTECTED], counts[APM_NOTIFICATION_KIND_REARMED],
         counts[APM_NOTIFICATION_KIND_MIGRATED], counts[APM_NOTIFICATION_KIND_UNPROTECTED],
         counts[APM_NOTIFICATION_KIND_LOST]);
  CHECK(counts[APM_NOTIFICATION_KIND_PROTECTED] == (int)n, "every connection protected");
  CHECK(counts[APM_NOTIFICATION_KIND_MIGRATED] > 0, "migrations");
  CHECK(counts[APM_NOTIFICATION_KIND_REARMED] > 0, "re-armed");
  CHECK(counts[APM_NOTIFICATION_KIND_LOST] == 0, "nothing lost");
  printf("moves for a local port down %d\n", local_port);
  CHECK(local_port > 0, "h2's own port went down with rail A's switch");

  /* Callback mode. */
  CHECK(apm_set_callback(m, on_note, &callbacks) == APM_STATUS_OK, "callback");
  CHECK(apm_sim_run_for(m, 3000) == APM_STATUS_OK, "run more");
  printf("callbacks %d\n", callbacks);
  CHECK(callbacks > 0, "the port flap at 3.5 s notifies through the callback");
  CHECK(apm_set_callback(m, NULL, NULL) == APM_STATUS_OK, "callback off");

  CHECK(apm_unprotect(m, first.id) == APM_STATUS_OK, "unprotect");
  CHECK(apm_unprotect(m, first.id) == APM_STATUS_ENGINE, "unprotect twice");
  CHECK(strlen(apm_last_error()) > 0, "message");
  apm_manager_destroy(m);
  apm_manager_destroy(NULL);
  printf("ok\n");
  return 0;
}
