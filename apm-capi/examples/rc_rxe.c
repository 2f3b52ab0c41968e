/* A C program that owns its RC QPs and hands them to apm.
 *
 * It opens two RDMA devices (default rxe0 and rxe1, the VM layout of `cargo xtask
 * hwtest --vm`: rxe0 on veth vA, rxe1 on its peer vB), creates an RC QP on each,
 * connects them to each other over the ports' GID 0 (RoCEv2 link-local IPv6), sends
 * numbered messages both ways, then asks apm to protect both QPs:
 *
 *   apm_manager_new_from_str("[[device]] ... provider = \"rxe\" ...")
 *   apm_protect(manager, qp, &conn_info)
 *
 * and prints what apm answered. apm's library cannot yet protect a QP it does not
 * post and poll itself on RoCE (provider-rxe migrates paths by replaying the sends it
 * numbered), so today the manager creation reports APM_STATUS_UNSUPPORTED with the
 * reason; the program says so and exits 3. It exits 0 only when protection is active.
 *
 * Build: gcc -std=gnu11 rc_rxe.c -I../include -libverbs -lapm_capi
 * Usage: rc_rxe [DEVICE_A DEVICE_B [MESSAGES]]
 */
#include "apm.h"

#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIE(...)                      \
  do {                                \
    fprintf(stderr, "rc_rxe: ");      \
    fprintf(stderr, __VA_ARGS__);     \
    fprintf(stderr, "\n");            \
    exit(1);                          \
  } while (0)

enum { MSG = 64, DEPTH = 16 };

struct end {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct ibv_mr *mr;
  char buf[2 * MSG];
  union ibv_gid gid;
  enum ibv_mtu mtu;
};

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

static void setup(struct end *e, const char *name) {
  e->ctx = open_dev(name);
  e->pd = ibv_alloc_pd(e->ctx);
  e->cq = ibv_create_cq(e->ctx, 2 * DEPTH, NULL, NULL, 0);
  e->mr = ibv_reg_mr(e->pd, e->buf, sizeof e->buf, IBV_ACCESS_LOCAL_WRITE);
  if (!e->pd || !e->cq || !e->mr) DIE("%s: resources", name);
  struct ibv_qp_init_attr ia = {
      .send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = DEPTH, .max_recv_wr = DEPTH, .max_send_sge = 1, .max_recv_sge = 1},
  };
  e->qp = ibv_create_qp(e->pd, &ia);
  if (!e->qp) DIE("%s: ibv_create_qp", name);
  if (ibv_query_gid(e->ctx, 1, 0, &e->gid)) DIE("%s: ibv_query_gid", name);
  struct ibv_port_attr pa;
  if (ibv_query_port(e->ctx, 1, &pa)) DIE("%s: ibv_query_port", name);
  e->mtu = pa.active_mtu;
}

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
  a.ah_attr.grh.dgid = peer->gid;
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    DIE("RTR");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
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

/* Wait for `want` completions on e's CQ; all must succeed. */
static void wait_cq(struct end *e, int want) {
  struct ibv_wc wc[4];
  for (long spins = 0; want > 0; spins++) {
    int n = ibv_poll_cq(e->cq, 4, wc);
    if (n < 0) DIE("poll_cq");
    for (int i = 0; i < n; i++)
      if (wc[i].status != IBV_WC_SUCCESS) DIE("completion: %s", ibv_wc_status_str(wc[i].status));
    want -= n;
    if (spins > 200000000L) DIE("no completion");
  }
}

static void ap(ApmPath *p, const struct end *e, const struct end *peer) {
  memset(p, 0, sizeof *p);
  p->port = 1;
  memcpy(p->sgid, e->gid.raw, 16);
  memcpy(p->dgid, peer->gid.raw, 16);
  p->hop_limit = 64;
  p->mtu = (uint8_t)e->mtu;
  p->ack_timeout = 14;
}

int main(int argc, char **argv) {
  const char *da = argc > 2 ? argv[1] : "rxe0", *db = argc > 2 ? argv[2] : "rxe1";
  unsigned count = argc > 3 ? (unsigned)atoi(argv[3]) : 100;
  struct end a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  setup(&a, da);
  setup(&b, db);
  connect_qp(&a, &b);
  connect_qp(&b, &a);
  printf("connected %s qpn %u <-> %s qpn %u\n", da, a.qp->qp_num, db, b.qp->qp_num);
  for (unsigned i = 0; i < count; i++) {
    post_recv(&b);
    post_recv(&a);
    send_msg(&a, i);
    send_msg(&b, i);
    wait_cq(&a, 2);
    wait_cq(&b, 2);
  }
  printf("exchanged %u messages each way\n", count);

  /* Hand both QPs to apm. */
  char config[256];
  snprintf(config, sizeof config,
           "[[device]]\nname = \"%s\"\nprovider = \"rxe\"\n[[device]]\nname = \"%s\"\n"
           "provider = \"rxe\"\n[lap]\ntransport = \"udp\"\nudp_listen = \"127.0.0.1:18515\"\n",
           da, db);
  ApmManager *m = NULL;
  ApmStatus st = apm_manager_new_from_str(config, &m);
  if (st != APM_STATUS_OK) {
    printf("apm: manager not created: status %d: %s\n", (int)st, apm_last_error());
    printf("protection NOT active\n");
    return st == APM_STATUS_UNSUPPORTED ? 3 : 1;
  }
  ApmConnInfo ia = {.id = 1, .active = 1, .software = 1, .local_qpn = a.qp->qp_num,
                    .remote_qpn = b.qp->qp_num, .local_comm_id = 1, .remote_comm_id = 2};
  ap(&ia.primary, &a, &b);
  ApmConnInfo ib = {.id = 2, .active = 0, .software = 1, .local_qpn = b.qp->qp_num,
                    .remote_qpn = a.qp->qp_num, .local_comm_id = 2, .remote_comm_id = 1};
  ap(&ib.primary, &b, &a);
  ib.primary.device = 1;
  st = apm_protect(m, (ibv_qp *)a.qp, &ia);
  if (st == APM_STATUS_OK) st = apm_protect(m, (ibv_qp *)b.qp, &ib);
  if (st != APM_STATUS_OK) {
    printf("apm: protect refused: status %d: %s\n", (int)st, apm_last_error());
    printf("protection NOT active\n");
    apm_manager_destroy(m);
    return 3;
  }
  printf("protection active\n");
  apm_manager_destroy(m);
  return 0;
}
