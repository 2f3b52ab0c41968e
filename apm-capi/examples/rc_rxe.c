/* A C program that owns its RC QPs, hands them to apm, and survives a path cut.
 *
 * It plays both ends of one RoCE connection in one process: end A on device DEV_A, end
 * B on DEV_B, each with its own apm manager (as two hosts would have), talking to each
 * other over UDP on 127.0.0.1. The connection has two rails, two IPv4 addresses per
 * device (the layout of `cargo xtask hwtest --vm`: VLANs 10 and 20 over veth vA/vB):
 *
 *   1. create, connect (over rail 1) and exercise the QPs with plain libibverbs;
 *   2. apm_manager_new_from_str() per end, apm_protect(manager, qp, &info) with rail 1
 *      as the primary and rail 2 as the agreed alternate, wait for PROTECTED;
 *   3. exchange numbered messages both ways, checking each arrives once and in order.
 *      The loop is a watchdog too: when no completion comes for STALL_MS while work is
 *      outstanding, it calls apm_report_stall() (apm cannot see an application's
 *      completions; a dead path with no port event is noticed here). apm moves both
 *      QPs to the alternate with the SQ drain, and the messages flow again.
 *   --pause-at N stops before message N (repeatable), prints "paused at N" and waits
 *   for a line on stdin, printing apm's notifications meanwhile: cut a rail (`tc qdisc
 *   add dev vA.10 root netem loss 100%`) or restore one, and press Enter.
 *
 * Exit 0: every message arrived once, in order, and protection was active; 1: an
 * error; 2: apm reported the connection lost; 3: protection never became active.
 *
 * Build: gcc -std=gnu11 rc_rxe.c -I../include -libverbs -lapm_capi
 * Usage: rc_rxe [DEV_A DEV_B A_RAIL1 B_RAIL1 A_RAIL2 B_RAIL2 [MESSAGES]] [--pause-at N]...
 */
#include "apm.h"

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DIE(...)                      \
  do {                                \
    fprintf(stderr, "rc_rxe: ");      \
    fprintf(stderr, __VA_ARGS__);     \
    fprintf(stderr, "\n");            \
    exit(1);                          \
  } while (0)

enum { MSG = 64, DEPTH = 16, STALL_MS = 300, ROUND_TIMEOUT_MS = 30000, MAX_PAUSES = 8 };

struct end {
  const char *name;
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct ibv_mr *mr;
  char buf[2 * MSG];
  int rail_gid[2]; /* GID index of each rail's address */
  union ibv_gid gid[2];
  enum ibv_mtu mtu;
  ApmManager *apm;
  uint64_t conn_id;
  int protected_, migrations, lost;
};

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static struct ibv_context *open_dev(const char *name) {
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  if (!list) DIE("ibv_get_device_list: no RDMA stack here");
  struct ibv_context *ctx = NULL;
  for (int i = 0; i < n; i++)
    if (strcmp(ibv_get_device_name(list[i]), name) == 0) ctx = ibv_open_device(list[i]);
  ibv_free_device_list(list);
  if (!ctx) DIE("no device %s", name);
  return ctx;
}

/* The RoCE v2 GID of an IPv4 address: ::ffff:a.b.c.d. */
static union ibv_gid gid_of(const char *ip) {
  union ibv_gid g;
  memset(&g, 0, sizeof g);
  g.raw[10] = g.raw[11] = 0xff;
  if (inet_pton(AF_INET, ip, &g.raw[12]) != 1) DIE("%s is not an IPv4 address", ip);
  return g;
}

/* The index of `g` in port 1's GID table (rxe adds an address's GID shortly after the
 * address appears: wait up to 5 s). */
static int gid_index(struct end *e, union ibv_gid g, const char *ip) {
  for (int tries = 0; tries < 500; tries++) {
    for (int i = 0; i < 64; i++) {
      union ibv_gid x;
      if (ibv_query_gid(e->ctx, 1, i, &x) == 0 && memcmp(&x, &g, sizeof g) == 0) return i;
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  DIE("%s: no GID for %s", e->name, ip);
}

static void setup(struct end *e, const char *name, const char *ip1, const char *ip2) {
  e->name = name;
  e->ctx = open_dev(name);
  e->pd = ibv_alloc_pd(e->ctx);
  e->cq = ibv_create_cq(e->ctx, 2 * DEPTH, NULL, NULL, 0);
  e->mr = ibv_reg_mr(e->pd, e->buf, sizeof e->buf, IBV_ACCESS_LOCAL_WRITE);
  if (!e->pd || !e->cq || !e->mr) DIE("%s: resources", name);
  struct ibv_qp_init_attr ia = {
      .send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 0,
      .cap = {.max_send_wr = DEPTH, .max_recv_wr = DEPTH, .max_send_sge = 1, .max_recv_sge = 1},
  };
  e->qp = ibv_create_qp(e->pd, &ia);
  if (!e->qp) DIE("%s: ibv_create_qp", name);
  e->gid[0] = gid_of(ip1);
  e->gid[1] = gid_of(ip2);
  e->rail_gid[0] = gid_index(e, e->gid[0], ip1);
  e->rail_gid[1] = gid_index(e, e->gid[1], ip2);
  struct ibv_port_attr pa;
  if (ibv_query_port(e->ctx, 1, &pa)) DIE("%s: ibv_query_port", name);
  e->mtu = pa.active_mtu;
}

/* Connect e to peer over rail 0. No access flags: apm restarts the send queue after a
 * path move with the send doorbell alone, which needs none and completes nothing. */
static void connect_qp(struct end *e, const struct end *peer) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                          .qp_access_flags = 0};
  if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    DIE("INIT");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = e->mtu < peer->mtu ? e->mtu : peer->mtu;
  a.dest_qp_num = peer->qp->qp_num;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = peer->gid[0];
  a.ah_attr.grh.sgid_index = (uint8_t)e->rail_gid[0];
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    DIE("RTR");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7; /* rxe retries forever: a dead path never errors, it stalls */
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    DIE("RTS");
}

static void post_recv(struct end *e) {
  struct ibv_sge s = {.addr = (uintptr_t)(e->buf + MSG), .length = MSG, .lkey = e->mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = 2, .sg_list = &s, .num_sge = 1}, *bad;
  if (ibv_post_recv(e->qp, &wr, &bad)) DIE("post_recv");
}

static void send_msg(struct end *e, unsigned n) {
  snprintf(e->buf, MSG, "message %u", n);
  struct ibv_sge s = {.addr = (uintptr_t)e->buf, .length = MSG, .lkey = e->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
                           .send_flags = IBV_SEND_SIGNALED}, *bad;
  if (ibv_post_send(e->qp, &wr, &bad)) DIE("post_send");
}

/* The IPv4 address of a ::ffff: GID, for printing. */
static const char *ip_of(const uint8_t *gid, char *out) {
  if (!inet_ntop(AF_INET, gid + 12, out, INET_ADDRSTRLEN)) strcpy(out, "?");
  return out;
}

/* Take every pending notification of e's manager (non-blocking) and print it. */
static void pump(struct end *e) {
  ApmNotification n;
  while (apm_next_notification(e->apm, &n) == APM_STATUS_OK) {
    char s[INET_ADDRSTRLEN], d[INET_ADDRSTRLEN];
    switch (n.kind) {
      case APM_NOTIFICATION_KIND_PROTECTED:
      case APM_NOTIFICATION_KIND_REARMED:
        e->protected_ = 1;
        printf("apm %s: conn %llu %s, alternate %s -> %s\n", e->name,
               (unsigned long long)n.conn_id,
               n.kind == APM_NOTIFICATION_KIND_PROTECTED ? "protected" : "rearmed",
               ip_of(n.path.sgid, s), ip_of(n.path.dgid, d));
        break;
      case APM_NOTIFICATION_KIND_MIGRATED:
        e->migrations++;
        printf("apm %s: conn %llu migrated, primary now %s -> %s\n", e->name,
               (unsigned long long)n.conn_id, ip_of(n.path.sgid, s), ip_of(n.path.dgid, d));
        break;
      case APM_NOTIFICATION_KIND_UNPROTECTED:
        printf("apm %s: conn %llu unprotected (%s)\n", e->name, (unsigned long long)n.conn_id,
               n.reason);
        break;
      case APM_NOTIFICATION_KIND_LOST:
        e->lost = 1;
        printf("apm %s: conn %llu LOST (%s)\n", e->name, (unsigned long long)n.conn_id, n.reason);
        break;
    }
    fflush(stdout);
  }
}

/* Wait for `want` successful completions on each end, reporting a stall to apm when
 * none comes for STALL_MS (again every 4 * STALL_MS while it lasts). Returns the
 * longest time without a completion. */
static double round_trip(struct end *a, struct end *b, int want, int *stalls) {
  int need[2] = {want, want};
  struct end *ends[2] = {a, b};
  double last = now_ms(), start = last, longest = 0, reported = 0;
  while (need[0] > 0 || need[1] > 0) {
    int progress = 0;
    for (int k = 0; k < 2; k++) {
      struct ibv_wc wc[4];
      int n = ibv_poll_cq(ends[k]->cq, 4, wc);
      if (n < 0) DIE("poll_cq");
      for (int i = 0; i < n; i++) {
        if (wc[i].status != IBV_WC_SUCCESS)
          DIE("%s: completion: %s", ends[k]->name, ibv_wc_status_str(wc[i].status));
        need[k]--;
      }
      if (n > 0) {
        progress = 1;
        double t = now_ms();
        if (t - last > longest) longest = t - last;
        last = t;
        reported = 0;
      }
      pump(ends[k]);
      if (ends[k]->lost) {
        printf("connection lost\n");
        exit(2);
      }
    }
    double t = now_ms();
    if (t - last > STALL_MS && (reported == 0 || t - reported > 4 * STALL_MS)) {
      printf("no completion for %.0f ms: reporting a stall to apm\n", t - last);
      fflush(stdout);
      for (int k = 0; k < 2; k++)
        if (apm_report_stall(ends[k]->apm, ends[k]->conn_id) != APM_STATUS_OK)
          printf("apm %s: stall report refused: %s\n", ends[k]->name, apm_last_error());
      (*stalls)++;
      reported = t;
    }
    if (t - start > ROUND_TIMEOUT_MS) DIE("no completion for %d ms: the connection is stuck", ROUND_TIMEOUT_MS);
    if (!progress) {
      /* Leave the CPU to apm's threads (and the kernel's rxe work) while waiting. */
      struct timespec ts = {0, 20 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  if (now_ms() - last > longest) longest = now_ms() - last;
  return longest;
}

/* Wait for a line on stdin, printing apm's notifications meanwhile. */
static void pause_here(struct end *a, struct end *b, unsigned i) {
  printf("paused at %u: press Enter to continue\n", i);
  fflush(stdout);
  for (;;) {
    struct pollfd fds[3] = {{0, POLLIN, 0},
                            {apm_notification_fd(a->apm), POLLIN, 0},
                            {apm_notification_fd(b->apm), POLLIN, 0}};
    if (poll(fds, 3, 100) < 0) DIE("poll");
    pump(a);
    pump(b);
    if (a->lost || b->lost) {
      printf("connection lost\n");
      exit(2);
    }
    if (fds[0].revents & (POLLIN | POLLHUP)) {
      char line[64];
      if (!fgets(line, sizeof line, stdin)) DIE("stdin closed while paused");
      return;
    }
  }
}

static void ap(ApmPath *p, const struct end *e, const struct end *peer, int rail) {
  memset(p, 0, sizeof *p);
  p->device = 0; /* each manager has one device */
  p->port = 1;
  memcpy(p->sgid, e->gid[rail].raw, 16);
  memcpy(p->dgid, peer->gid[rail].raw, 16);
  p->sgid_index = (uint8_t)e->rail_gid[rail];
  p->hop_limit = 64;
  p->mtu = (uint8_t)(e->mtu < peer->mtu ? e->mtu : peer->mtu);
  p->ack_timeout = 14;
}

/* One apm per end: its device, its UDP port, the peer's rail GIDs at the peer's port. */
static void start_apm(struct end *e, const struct end *peer, int my_port, int peer_port) {
  char g0[INET_ADDRSTRLEN], g1[INET_ADDRSTRLEN], config[1024];
  snprintf(config, sizeof config,
           "[[device]]\nname = \"%s\"\nprovider = \"rxe\"\n"
           "[lap]\ntransport = \"udp\"\nudp_listen = \"127.0.0.1:%d\"\n"
           "[[lap.peer]]\ngid = \"::ffff:%s\"\naddr = \"127.0.0.1:%d\"\n"
           "[[lap.peer]]\ngid = \"::ffff:%s\"\naddr = \"127.0.0.1:%d\"\n",
           e->name, my_port, ip_of(peer->gid[0].raw, g0), peer_port, ip_of(peer->gid[1].raw, g1),
           peer_port);
  ApmStatus st = apm_manager_new_from_str(config, &e->apm);
  if (st != APM_STATUS_OK) {
    printf("apm %s: manager not created: status %d: %s\n", e->name, (int)st, apm_last_error());
    printf("protection NOT active\n");
    exit(3);
  }
}

static void protect(struct end *e, const struct end *peer, int active, uint64_t id,
                    uint64_t peer_id) {
  ApmPath alt;
  ap(&alt, e, peer, 1);
  ApmConnInfo info = {.id = id, .active = active, .software = 1, .local_qpn = e->qp->qp_num,
                      .remote_qpn = peer->qp->qp_num, .local_comm_id = (uint32_t)id,
                      .remote_comm_id = (uint32_t)peer_id, .has_agreed_alternate = 1,
                      .candidates = &alt, .n_candidates = 1};
  ap(&info.primary, e, peer, 0);
  info.agreed_alternate = alt;
  e->conn_id = id;
  ApmStatus st = apm_protect(e->apm, (ibv_qp *)e->qp, &info);
  if (st != APM_STATUS_OK) {
    printf("apm %s: protect refused: status %d: %s\n", e->name, (int)st, apm_last_error());
    printf("protection NOT active\n");
    exit(3);
  }
}

/* Wait on both managers' fds until both connections are protected (10 s at most). */
static void wait_protected(struct end *a, struct end *b) {
  double until = now_ms() + 10000;
  while (!(a->protected_ && b->protected_)) {
    struct pollfd fds[2] = {{apm_notification_fd(a->apm), POLLIN, 0},
                            {apm_notification_fd(b->apm), POLLIN, 0}};
    if (poll(fds, 2, 100) < 0) DIE("poll");
    pump(a);
    pump(b);
    if (now_ms() > until) {
      printf("protection NOT active (no PROTECTED notification in 10 s)\n");
      exit(3);
    }
  }
}

int main(int argc, char **argv) {
  const char *pos[7] = {"rxe0", "rxe1", "10.0.10.1", "10.0.10.2", "10.0.20.1", "10.0.20.2", "2000"};
  unsigned pauses[MAX_PAUSES];
  int npos = 0, npauses = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--pause-at") == 0 && i + 1 < argc && npauses < MAX_PAUSES)
      pauses[npauses++] = (unsigned)atoi(argv[++i]);
    else if (npos < 7)
      pos[npos++] = argv[i];
    else
      DIE("usage: rc_rxe [DEV_A DEV_B A_RAIL1 B_RAIL1 A_RAIL2 B_RAIL2 [MESSAGES]] [--pause-at N]...");
  }
  unsigned count = (unsigned)atoi(pos[6]);
  struct end a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  setup(&a, pos[0], pos[2], pos[4]);
  setup(&b, pos[1], pos[3], pos[5]);
  connect_qp(&a, &b);
  connect_qp(&b, &a);
  printf("connected %s qpn %u <-> %s qpn %u over %s <-> %s\n", a.name, a.qp->qp_num, b.name,
         b.qp->qp_num, pos[2], pos[3]);

  start_apm(&a, &b, 18515, 18516);
  start_apm(&b, &a, 18516, 18515);
  protect(&a, &b, 1, 1, 2);
  protect(&b, &a, 0, 2, 1);
  wait_protected(&a, &b);
  printf("protection active\n");
  fflush(stdout);

  double longest = 0;
  int stalls = 0;
  for (unsigned i = 0; i < count; i++) {
    for (int p = 0; p < npauses; p++)
      if (pauses[p] == i) pause_here(&a, &b, i);
    post_recv(&b);
    post_recv(&a);
    send_msg(&a, i);
    send_msg(&b, i);
    double l = round_trip(&a, &b, 2, &stalls);
    if (l > longest) longest = l;
    char want[MSG];
    snprintf(want, sizeof want, "message %u", i);
    if (strcmp(a.buf + MSG, want) || strcmp(b.buf + MSG, want))
      DIE("out of order or duplicated at %u: A got \"%.20s\", B got \"%.20s\"", i, a.buf + MSG,
          b.buf + MSG);
  }
  pump(&a);
  pump(&b);
  printf("exchanged %u messages each way: all arrived once and in order; longest wait %.0f ms; "
         "stalls reported %d; migrations %s %d, %s %d\n",
         count, longest, stalls, a.name, a.migrations, b.name, b.migrations);
  apm_manager_destroy(a.apm);
  apm_manager_destroy(b.apm);
  ibv_destroy_qp(a.qp);
  ibv_destroy_qp(b.qp);
  return 0;
}
