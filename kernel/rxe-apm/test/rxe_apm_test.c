/* rxe_apm_test: the kernel/rxe-apm patch set, tested through plain libibverbs.
 *
 * One RC connection between two soft-RoCE devices (end A on DEV_A, end B on DEV_B),
 * with two paths: rail 1 (A_IP1 <-> B_IP1) and rail 2 (A_IP2 <-> B_IP2), IPv4 addresses
 * whose RoCE v2 GIDs the devices list (VLANs over one veth pair in the project's VM).
 * Numbered messages flow both ways in every step, each checked to arrive once and in
 * order, while the connection goes through every path migration state and event:
 *
 *   1. the alternate path is accepted at INIT->RTR on a RoCE port and reads back, with
 *      its own ACK timeout and port; the QP is MIGRATED; ARMED cannot be set;
 *   2. REARM on both ends; MIGRATED from REARM is refused; traffic (MigReq=0) arms both;
 *      REARM on an ARMED QP is refused;
 *   3. MIGRATED forced on A under traffic: IBV_EVENT_PATH_MIG on A at once, on B when
 *      A's MigReq=1 packets reach B's alternate; both run on rail 2 with the alternate's
 *      ACK timeout, and rail 1 carries nothing more;
 *   4. re-armed with rail 1 as the alternate; rail 2 cut silently (netem loss 100% on
 *      A's side): the requesters run out of retries and migrate (PATH_MIG on both);
 *   5. re-armed with rail 2; rail 1's link taken down on A's side: the armed QPs' packets
 *      that cannot leave are lost, not errors, and the QPs migrate to rail 2;
 *   6. PATH_MIG_ERR: B armed while A is still in REARM (B's packets to A dropped), B
 *      forced to migrate: B's MigReq=1 packet on A's alternate is a migration A cannot
 *      follow: IBV_EVENT_PATH_MIG_ERR on A, which stays on its primary, in REARM.
 *
 * Exit 0: every step passed; 1: a step failed (the reason on stderr).
 *
 * Build: gcc -std=gnu11 rxe_apm_test.c -libverbs
 * Usage: rxe_apm_test DEV_A DEV_B A_IP1 B_IP1 A_IP2 B_IP2 A_NETDEV1 A_NETDEV2 B_NETDEV1
 *        B_NETDEV2 RAILS_SCRIPT
 *   X_NETDEVn: the netdev of end X's address on rail n (links are cut there);
 *   RAILS_SCRIPT: a shell script that (re)creates the rails' routes after a link up.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rxe_apm_test: FAILED: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

#define CHECK(cond, ...) \
  do {                   \
    if (!(cond)) die(__VA_ARGS__); \
  } while (0)

enum { SLOT = 64, DEPTH = 64, WINDOW = 16, MAX_EVENTS = 64 };
enum { TIMEOUT = 14, ALT_TIMEOUT = 15, RETRY_CNT = 3 };
/* The ACK timeout of the alternate step 5 migrates to (~1 s): step 6 holds one of A's
 * sends unacknowledged on it, and A must not run out of retries meanwhile. */
enum { LONG_TIMEOUT = 18 };

struct event {
  enum ibv_event_type type;
  uint32_t qpn;
  double at;
};

struct end {
  const char *name;
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct ibv_mr *mr;
  char buf[2 * DEPTH * SLOT]; /* receive slots, then send slots */
  int gid_index[2];           /* of each rail's address */
  union ibv_gid gid[2];
  struct event events[MAX_EVENTS];
  int n_events;
  /* traffic: next number to send, sends outstanding, next number due, receives posted */
  uint64_t sent, outstanding, due, posted;
};

static const char *netdev_a[2], *netdev_b[2], *rails_script;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void sh(const char *fmt, ...) {
  char cmd[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int rc = system(cmd);
  CHECK(rc == 0, "`%s` failed (%d)", cmd, rc);
}

static uint64_t tx_packets(const char *netdev) {
  char path[256];
  unsigned long long n = 0;
  snprintf(path, sizeof path, "/sys/class/net/%s/statistics/tx_packets", netdev);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  if (fscanf(f, "%llu", &n) != 1) n = 0;
  fclose(f);
  return n;
}

static struct ibv_context *open_dev(const char *name) {
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  CHECK(list, "ibv_get_device_list: no RDMA stack here");
  struct ibv_context *ctx = NULL;
  for (int i = 0; i < n; i++)
    if (strcmp(ibv_get_device_name(list[i]), name) == 0) ctx = ibv_open_device(list[i]);
  ibv_free_device_list(list);
  CHECK(ctx, "no device %s", name);
  return ctx;
}

/* The GID index of an IPv4 address's RoCE v2 GID (::ffff:a.b.c.d), waited for. */
static int gid_index(struct end *e, const char *ip, union ibv_gid *g) {
  struct in_addr a;
  CHECK(inet_pton(AF_INET, ip, &a) == 1, "bad IPv4 address %s", ip);
  memset(g, 0, sizeof *g);
  g->raw[10] = g->raw[11] = 0xff;
  memcpy(&g->raw[12], &a, 4);
  struct ibv_port_attr pa;
  CHECK(ibv_query_port(e->ctx, 1, &pa) == 0, "%s: query_port", e->name);
  for (int tries = 0; tries < 200; tries++) {
    for (int i = 0; i < pa.gid_tbl_len; i++) {
      union ibv_gid x;
      if (ibv_query_gid(e->ctx, 1, i, &x) == 0 && memcmp(&x, g, sizeof x) == 0) return i;
    }
    usleep(50000);
  }
  die("%s lists no GID for %s", e->name, ip);
  return -1;
}

static void setup(struct end *e, const char *dev, const char *ip1, const char *ip2) {
  e->name = dev;
  e->ctx = open_dev(dev);
  e->pd = ibv_alloc_pd(e->ctx);
  e->cq = ibv_create_cq(e->ctx, 4 * DEPTH, NULL, NULL, 0);
  e->mr = ibv_reg_mr(e->pd, e->buf, sizeof e->buf, IBV_ACCESS_LOCAL_WRITE);
  CHECK(e->pd && e->cq && e->mr, "%s: pd/cq/mr", dev);
  struct ibv_qp_init_attr ia = {
      .send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = DEPTH, .max_recv_wr = DEPTH, .max_send_sge = 1, .max_recv_sge = 1}};
  e->qp = ibv_create_qp(e->pd, &ia);
  CHECK(e->qp, "%s: ibv_create_qp", dev);
  e->gid_index[0] = gid_index(e, ip1, &e->gid[0]);
  e->gid_index[1] = gid_index(e, ip2, &e->gid[1]);
  int fl = fcntl(e->ctx->async_fd, F_GETFL);
  CHECK(fcntl(e->ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0, "async fd non-blocking");
}

/* The path from @e to @peer over @rail (0 or 1). */
static struct ibv_ah_attr path(const struct end *e, const struct end *peer, int rail) {
  struct ibv_ah_attr ah = {.is_global = 1, .port_num = 1};
  ah.grh.dgid = peer->gid[rail];
  ah.grh.sgid_index = (uint8_t)e->gid_index[rail];
  ah.grh.hop_limit = 64;
  return ah;
}

/* RESET -> INIT -> RTR (primary rail 1, alternate rail 2) -> RTS, both ends. */
static void connect_pair(struct end *a, struct end *b) {
  struct end *ends[2] = {a, b};
  for (int k = 0; k < 2; k++) {
    struct end *e = ends[k], *peer = ends[1 - k];
    struct ibv_qp_attr at = {.qp_state = IBV_QPS_INIT, .port_num = 1};
    CHECK(!ibv_modify_qp(e->qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                         IBV_QP_ACCESS_FLAGS),
          "%s: RESET->INIT", e->name);
    struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
                            .dest_qp_num = peer->qp->qp_num, .rq_psn = 0x100 * (2 - k),
                            .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
                            .ah_attr = path(e, peer, 0), .alt_ah_attr = path(e, peer, 1),
                            .alt_port_num = 1, .alt_timeout = ALT_TIMEOUT};
    int err = ibv_modify_qp(e->qp, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                           IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER |
                                           IBV_QP_ALT_PATH);
    CHECK(!err, "%s: INIT->RTR with IBV_QP_ALT_PATH refused: %s (stock modules loaded?)",
          e->name, strerror(err));
    struct ibv_qp_attr s = {.qp_state = IBV_QPS_RTS, .sq_psn = 0x100 * (k + 1),
                            .timeout = TIMEOUT, .retry_cnt = RETRY_CNT, .rnr_retry = 7,
                            .max_rd_atomic = 1};
    CHECK(!ibv_modify_qp(e->qp, &s, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                                        IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                        IBV_QP_MAX_QP_RD_ATOMIC),
          "%s: RTR->RTS", e->name);
  }
}

static struct ibv_qp_attr query(const struct end *e) {
  struct ibv_qp_attr q;
  struct ibv_qp_init_attr ia;
  CHECK(!ibv_query_qp(e->qp, &q, IBV_QP_STATE | IBV_QP_PATH_MIG_STATE | IBV_QP_AV |
                                     IBV_QP_ALT_PATH | IBV_QP_TIMEOUT | IBV_QP_PORT, &ia),
        "%s: query_qp", e->name);
  return q;
}

static const char *mig_name(enum ibv_mig_state m) {
  return m == IBV_MIG_MIGRATED ? "MIGRATED" : m == IBV_MIG_REARM ? "REARM" : "ARMED";
}

/* The rail (0, 1) the QP's primary path uses, from the source GID index. */
static int primary_rail(const struct end *e) {
  struct ibv_qp_attr q = query(e);
  return q.ah_attr.grh.sgid_index == e->gid_index[1];
}

/* RTS->RTS with IBV_QP_PATH_MIG_STATE; returns the errno (0: accepted). */
static int set_mig(struct end *e, enum ibv_mig_state m) {
  struct ibv_qp_attr a = {.path_mig_state = m};
  return ibv_modify_qp(e->qp, &a, IBV_QP_PATH_MIG_STATE);
}

static void load_alt(struct end *e, const struct end *peer, int rail, uint8_t timeout) {
  struct ibv_qp_attr a = {.alt_ah_attr = path(e, peer, rail), .alt_port_num = 1,
                          .alt_timeout = timeout};
  int err = ibv_modify_qp(e->qp, &a, IBV_QP_ALT_PATH);
  CHECK(!err, "%s: RTS->RTS with IBV_QP_ALT_PATH: %s", e->name, strerror(err));
}

/* Read (and ack) every pending async event of @e. */
static void read_events(struct end *e) {
  struct ibv_async_event ev;
  while (ibv_get_async_event(e->ctx, &ev) == 0) {
    uint32_t qpn = 0;
    if (ev.event_type == IBV_EVENT_PATH_MIG || ev.event_type == IBV_EVENT_PATH_MIG_ERR ||
        ev.event_type == IBV_EVENT_COMM_EST || ev.event_type == IBV_EVENT_QP_FATAL)
      qpn = ev.element.qp->qp_num;
    if (e->n_events < MAX_EVENTS)
      e->events[e->n_events++] = (struct event){ev.event_type, qpn, now_ms()};
    printf("  %s: event %s (qpn %" PRIu32 ")\n", e->name, ibv_event_type_str(ev.event_type),
           qpn);
    ibv_ack_async_event(&ev);
  }
}

static int count_events(const struct end *e, enum ibv_event_type t) {
  int n = 0;
  for (int i = 0; i < e->n_events; i++)
    if (e->events[i].type == t && e->events[i].qpn == e->qp->qp_num) n++;
  return n;
}

static void post_recv(struct end *e, uint64_t i) {
  struct ibv_sge s = {.addr = (uintptr_t)(e->buf + (i % DEPTH) * SLOT), .length = SLOT,
                      .lkey = e->mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &s, .num_sge = 1}, *bad;
  CHECK(!ibv_post_recv(e->qp, &wr, &bad), "%s: post_recv", e->name);
}

static void post_send(struct end *e) {
  char *slot = e->buf + (DEPTH + e->sent % DEPTH) * SLOT;
  memcpy(slot, &e->sent, sizeof e->sent);
  struct ibv_sge s = {.addr = (uintptr_t)slot, .length = sizeof e->sent, .lkey = e->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 1ull << 63 | e->sent, .sg_list = &s, .num_sge = 1,
                           .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED},
                     *bad;
  CHECK(!ibv_post_send(e->qp, &wr, &bad), "%s: post_send", e->name);
  e->sent++;
  e->outstanding++;
}

/* Fill each end's receive queue (once, before the first exchange). */
static void start_traffic(struct end *a, struct end *b) {
  struct end *ends[2] = {a, b};
  for (int k = 0; k < 2; k++)
    for (; ends[k]->posted < DEPTH; ends[k]->posted++) post_recv(ends[k], ends[k]->posted);
}

/* One polling round of one end: post up to the window, reap completions. Returns the
 * number of messages that arrived. */
static int pump(struct end *e, uint64_t until) {
  while (e->sent < until && e->outstanding < WINDOW) post_send(e);
  struct ibv_wc wc[16];
  int n = ibv_poll_cq(e->cq, 16, wc), got = 0;
  CHECK(n >= 0, "%s: poll_cq", e->name);
  for (int i = 0; i < n; i++) {
    CHECK(wc[i].status == IBV_WC_SUCCESS, "%s: completion of wr %" PRIx64 ": %s", e->name,
          wc[i].wr_id, ibv_wc_status_str(wc[i].status));
    if (wc[i].wr_id >> 63) {
      e->outstanding--;
      continue;
    }
    uint64_t num;
    memcpy(&num, e->buf + (wc[i].wr_id % DEPTH) * SLOT, sizeof num);
    CHECK(num == e->due, "%s: message %" PRIu64 " arrived when %" PRIu64 " was due (lost or "
          "duplicated)", e->name, num, e->due);
    e->due++;
    got++;
    post_recv(e, e->posted++);
  }
  read_events(e);
  return got;
}

/* Send @n more messages each way, calling @hook once when A has sent @at of them; fails
 * after @limit_ms. Returns the longest time with no message arriving at either end. */
static double exchange(struct end *a, struct end *b, uint64_t n, uint64_t at,
                       void (*hook)(struct end *, struct end *), double limit_ms) {
  uint64_t until_a = a->sent + n, until_b = b->sent + n, hook_at = a->sent + at;
  double start = now_ms(), last = start, longest = 0;
  while (a->due < until_b || b->due < until_a || a->outstanding || b->outstanding) {
    if (hook && a->sent >= hook_at) {
      hook(a, b);
      hook = NULL;
    }
    int got = pump(a, until_a) + pump(b, until_b);
    double t = now_ms();
    if (got) {
      if (t - last > longest) longest = t - last;
      last = t;
    }
    CHECK(t - start < limit_ms, "traffic stalled: A sent %" PRIu64 " got %" PRIu64
          ", B sent %" PRIu64 " got %" PRIu64, a->sent, a->due, b->sent, b->due);
  }
  return longest;
}

/* Exchange a few messages at a time until both QPs are ARMED. */
static double wait_armed(struct end *a, struct end *b) {
  double start = now_ms();
  for (;;) {
    enum ibv_mig_state ma = query(a).path_mig_state, mb = query(b).path_mig_state;
    if (ma == IBV_MIG_ARMED && mb == IBV_MIG_ARMED) return now_ms() - start;
    CHECK(now_ms() - start < 10000, "not ARMED 10 s after REARM: A %s, B %s", mig_name(ma),
          mig_name(mb));
    exchange(a, b, 4, 0, NULL, 10000);
  }
}

/* Keep traffic going until @e has seen @want PATH_MIG events in all. */
static void wait_event(struct end *a, struct end *b, struct end *e, enum ibv_event_type t,
                       int want) {
  double start = now_ms();
  while (count_events(e, t) < want) {
    CHECK(now_ms() - start < 10000, "%s: no %s within 10 s", e->name, ibv_event_type_str(t));
    exchange(a, b, 2, 0, NULL, 10000);
  }
}

static void force_a(struct end *a, struct end *b) {
  (void)b;
  int err = set_mig(a, IBV_MIG_MIGRATED);
  CHECK(!err, "%s: forcing MIGRATED: %s", a->name, strerror(err));
}

static void expect_on_rail(struct end *a, struct end *b, int rail, const char *step) {
  struct end *ends[2] = {a, b};
  for (int k = 0; k < 2; k++) {
    struct ibv_qp_attr q = query(ends[k]);
    CHECK(q.qp_state == IBV_QPS_RTS, "%s: %s: QP not in RTS", step, ends[k]->name);
    CHECK(q.path_mig_state == IBV_MIG_MIGRATED, "%s: %s: %s, not MIGRATED", step,
          ends[k]->name, mig_name(q.path_mig_state));
    CHECK(primary_rail(ends[k]) == rail, "%s: %s: primary not on rail %d", step,
          ends[k]->name, rail + 1);
  }
  uint64_t before = tx_packets(netdev_a[rail]), other = tx_packets(netdev_a[1 - rail]);
  exchange(a, b, 200, 0, NULL, 10000);
  uint64_t on = tx_packets(netdev_a[rail]) - before, off = tx_packets(netdev_a[1 - rail]) - other;
  printf("  200 messages each way after %s: %s sent %" PRIu64 " packets, %s %" PRIu64 "\n",
         step, netdev_a[rail], on, netdev_a[1 - rail], off);
  /* (a link just up sends a few packets of its own: IPv6 neighbour discovery) */
  CHECK(on >= 200 && off * 10 < on, "%s: traffic is not on rail %d", step, rail + 1);
}

static void rearm(struct end *a, struct end *b, int alt_rail, uint8_t timeout) {
  load_alt(a, b, alt_rail, timeout);
  load_alt(b, a, alt_rail, timeout);
  CHECK(!set_mig(a, IBV_MIG_REARM) && !set_mig(b, IBV_MIG_REARM), "REARM refused");
  printf("  REARM -> ARMED on both in %.1f ms (alternate rail %d)\n", wait_armed(a, b),
         alt_rail + 1);
}

int main(int argc, char **argv) {
  if (argc != 12) {
    fprintf(stderr, "usage: rxe_apm_test DEV_A DEV_B A_IP1 B_IP1 A_IP2 B_IP2 A_NETDEV1 "
                    "A_NETDEV2 B_NETDEV1 B_NETDEV2 RAILS_SCRIPT\n");
    return 1;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  netdev_a[0] = argv[7];
  netdev_a[1] = argv[8];
  netdev_b[0] = argv[9];
  netdev_b[1] = argv[10];
  rails_script = argv[11];
  static struct end a, b;
  setup(&a, argv[1], argv[3], argv[5]);
  setup(&b, argv[2], argv[4], argv[6]);

  /* 1 */
  connect_pair(&a, &b);
  struct ibv_qp_attr q = query(&a);
  CHECK(q.path_mig_state == IBV_MIG_MIGRATED, "a new QP is %s, not MIGRATED",
        mig_name(q.path_mig_state));
  CHECK(q.alt_ah_attr.grh.sgid_index == a.gid_index[1] && q.alt_port_num == 1 &&
            q.alt_timeout == ALT_TIMEOUT && q.timeout == TIMEOUT &&
            !memcmp(&q.alt_ah_attr.grh.dgid, &b.gid[1], sizeof b.gid[1]),
        "the alternate path does not read back as loaded");
  CHECK(set_mig(&a, IBV_MIG_ARMED) == EINVAL, "software set ARMED");
  CHECK(!set_mig(&a, IBV_MIG_MIGRATED), "MIGRATED on a MIGRATED QP (a no-op) refused");
  start_traffic(&a, &b);
  exchange(&a, &b, 100, 0, NULL, 10000);
  CHECK(count_events(&a, IBV_EVENT_PATH_MIG) + count_events(&b, IBV_EVENT_PATH_MIG) == 0,
        "PATH_MIG without a migration");
  printf("PASS 1: alternate path (rail 2, ACK timeout %d, port 1) loaded at INIT->RTR on "
         "RoCE and read back; MIGRATED; ARMED refused; 100 messages each way\n", ALT_TIMEOUT);

  /* 2 */
  CHECK(!set_mig(&a, IBV_MIG_REARM) && !set_mig(&b, IBV_MIG_REARM), "REARM refused");
  CHECK(set_mig(&a, IBV_MIG_MIGRATED) == EINVAL || query(&a).path_mig_state == IBV_MIG_ARMED,
        "MIGRATED from REARM accepted");
  printf("  REARM -> ARMED on both in %.1f ms\n", wait_armed(&a, &b));
  CHECK(set_mig(&a, IBV_MIG_REARM) == EINVAL, "REARM on an ARMED QP accepted");
  printf("PASS 2: REARM; MIGRATED from REARM refused; ARMED by MigReq=0 traffic; REARM on "
         "ARMED refused\n");

  /* 3 */
  double t0 = now_ms();
  exchange(&a, &b, 1000, 500, force_a, 20000);
  wait_event(&a, &b, &a, IBV_EVENT_PATH_MIG, 1);
  wait_event(&a, &b, &b, IBV_EVENT_PATH_MIG, 1);
  CHECK(query(&a).timeout == ALT_TIMEOUT, "the migrated QP does not use the alternate's "
        "ACK timeout");
  expect_on_rail(&a, &b, 1, "the forced migration");
  printf("PASS 3: forced MIGRATED on %s under traffic: PATH_MIG on both, both on rail 2 with "
         "ACK timeout %d, 1000 messages each way in order (%.0f ms)\n", a.name, ALT_TIMEOUT,
         now_ms() - t0);

  /* 4 */
  rearm(&a, &b, 0, TIMEOUT);
  exchange(&a, &b, 50, 0, NULL, 10000);
  sh("/usr/sbin/tc qdisc add dev %s root netem loss 100%%", netdev_a[1]);
  double stall = exchange(&a, &b, 400, 0, NULL, 30000);
  sh("/usr/sbin/tc qdisc del dev %s root", netdev_a[1]);
  wait_event(&a, &b, &a, IBV_EVENT_PATH_MIG, 2);
  wait_event(&a, &b, &b, IBV_EVENT_PATH_MIG, 2);
  expect_on_rail(&a, &b, 0, "retry exhaustion");
  printf("PASS 4: rail 2 cut silently: retries ran out, both migrated to rail 1 by "
         "themselves (PATH_MIG on both); longest wait %.0f ms; none lost or duplicated\n",
         stall);

  /* 5 */
  rearm(&a, &b, 1, LONG_TIMEOUT);
  exchange(&a, &b, 50, 0, NULL, 10000);
  sh("/usr/bin/ip link set %s down", netdev_a[0]);
  stall = exchange(&a, &b, 400, 0, NULL, 30000);
  sh("/usr/bin/ip link set %s up && sh %s", netdev_a[0], rails_script);
  wait_event(&a, &b, &a, IBV_EVENT_PATH_MIG, 3);
  wait_event(&a, &b, &b, IBV_EVENT_PATH_MIG, 3);
  expect_on_rail(&a, &b, 1, "the link down");
  printf("PASS 5: rail 1's link down on %s: no local error, both migrated to rail 2 "
         "(PATH_MIG on both); longest wait %.0f ms; none lost or duplicated\n", a.name, stall);

  /* 6 */
  load_alt(&a, &b, 0, TIMEOUT);
  load_alt(&b, &a, 0, TIMEOUT);
  exchange(&a, &b, 20, 0, NULL, 10000);
  /* B's packets to A on rail 2 (its primary) are dropped: A never sees MigReq=0. */
  sh("/usr/sbin/tc qdisc add dev %s root netem loss 100%%", netdev_b[1]);
  CHECK(!set_mig(&b, IBV_MIG_REARM), "B: REARM");
  CHECK(!set_mig(&a, IBV_MIG_REARM), "A: REARM");
  post_send(&a); /* MigReq=0 reaches B: B arms */
  double start = now_ms();
  while (query(&b).path_mig_state != IBV_MIG_ARMED) {
    CHECK(now_ms() - start < 5000, "B not ARMED by A's MigReq=0 packet");
    pump(&a, a.sent);
    pump(&b, b.sent);
  }
  CHECK(query(&a).path_mig_state == IBV_MIG_REARM, "A armed although B's packets are lost");
  CHECK(!set_mig(&b, IBV_MIG_MIGRATED), "B: forcing MIGRATED");
  post_send(&b); /* on rail 1 now, MigReq=1, onto A's alternate */
  start = now_ms();
  while (count_events(&a, IBV_EVENT_PATH_MIG_ERR) == 0) {
    CHECK(now_ms() - start < 5000, "%s: no PATH_MIG_ERR within 5 s", a.name);
    pump(&a, a.sent);
    pump(&b, b.sent);
  }
  sh("/usr/sbin/tc qdisc del dev %s root", netdev_b[1]);
  q = query(&a);
  CHECK(q.qp_state == IBV_QPS_RTS && q.path_mig_state == IBV_MIG_REARM && primary_rail(&a) == 1,
        "%s after PATH_MIG_ERR: not RTS/REARM on its primary", a.name);
  CHECK(count_events(&a, IBV_EVENT_PATH_MIG_ERR) == 1, "PATH_MIG_ERR more than once");
  printf("PASS 6: B migrated while A was in REARM: PATH_MIG_ERR on %s, which stays on its "
         "primary in REARM\n", a.name);
  printf("rxe_apm_test: all passed (%s qpn %u <-> %s qpn %u)\n", a.name, a.qp->qp_num,
         b.name, b.qp->qp_num);
  return 0;
}
