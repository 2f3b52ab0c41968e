/*
 * rc_dlopen: an RC exchange over libibverbs, loaded the way NCCL loads it: no link
 * to libibverbs, dlopen("libibverbs.so.1") and one dlvsym(handle, name, "IBVERBS_1.1")
 * per verb (built with -DAPM_LINKED it links libibverbs and calls it directly). The
 * hardware suite runs it under `apm run` in the VM (provider-verbs/tests/hw/shim.rs).
 *
 * The client sends numbered messages on each connection and the server echoes them:
 * one message in flight per connection, every number checked on both sides (once, in
 * order). It goes on until the stop file exists (-S) or -n round trips per connection,
 * then both ends exchange a stop mark and say "done". Lines on stdout (the test reads
 * them): "qp", "progress", "event", "own-sqd", "destroy", "child", "done".
 *
 * usage: rc_dlopen -d DEV -g GIDX [-D DEV2 -G GIDX2] [-p PORT] [-c CONNS] [-n MAX]
 *                  [-S STOPFILE] [-t ACK_TIMEOUT] [-r RETRY_CNT] [-e early|late] [-q]
 *                  [-x DESTROYFILE] [-A]
 *                  [-f noexec|exec|both] [SERVER_IP]
 *        rc_dlopen -L -d DEV -g GIDX -D DEV2 -G GIDX2     (a pair within the process)
 *        rc_dlopen -R                   (hold /dev/infiniband/uverbs0, call no verb)
 *
 *   -D/-G  a second device: connection i uses the first device if i is even, else the
 *          second (give the server the peers of the client's, in the same order)
 *   -e     read async events: a thread blocked in ibv_get_async_event from the start
 *          (early), or non-blocking reads only once the exchange is over (late)
 *   -q     at the end, the program's own RTS->SQD with en_sqd_async_notify on each QP,
 *          and wait (5 s at most) for its SQ_DRAINED
 *   -x     a failed completion marks its QP failed ("failed"), where it would end the
 *          program; every QP is destroyed when DESTROYFILE exists or the other end is
 *          gone, and "destroy" says what ibv_destroy_qp returned (the exit status is 0
 *          only if every one was 0)
 *   -r     the QPs' retry count (7, rxe's "for ever", by default)
 *   -A     with -D: make the two QP numbers equal (client) or different (server)
 *   -f     the client, after 100 round trips, forks a child that makes a pair of its
 *          own (-L) without exec, or execs this program with -L (both: the first after
 *          100 round trips, the second after 200); "child" is its exit status
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 16
#define MSG 64
#define STOP UINT64_MAX
/* One page: a receive and a send slot per connection. */
#define BUF_BYTES 4096
_Static_assert(2 * MAX_CONNS * MSG <= BUF_BYTES, "the slots fit in the buffer");

/* The verbs this program uses that are not static inline in verbs.h. */
static struct {
	struct ibv_device **(*get_device_list)(int *);
	const char *(*get_device_name)(struct ibv_device *);
	struct ibv_context *(*open_device)(struct ibv_device *);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *,
				    struct ibv_comp_channel *, int);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int,
			struct ibv_qp_init_attr *);
	int (*destroy_qp)(struct ibv_qp *);
	int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
	int (*get_async_event)(struct ibv_context *, struct ibv_async_event *);
	void (*ack_async_event)(struct ibv_async_event *);
	const char *(*event_type_str)(enum ibv_event_type);
	int (*fork_init)(void);
} v;

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "rc_dlopen: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

#ifdef APM_LINKED
static void bind_verbs(void)
{
	v.get_device_list = ibv_get_device_list;
	v.get_device_name = ibv_get_device_name;
	v.open_device = ibv_open_device;
	v.alloc_pd = ibv_alloc_pd;
	v.reg_mr = ibv_reg_mr;
	v.create_cq = ibv_create_cq;
	v.create_qp = ibv_create_qp;
	v.modify_qp = ibv_modify_qp;
	v.query_qp = ibv_query_qp;
	v.destroy_qp = ibv_destroy_qp;
	v.query_gid = ibv_query_gid;
	v.get_async_event = ibv_get_async_event;
	v.ack_async_event = ibv_ack_async_event;
	v.event_type_str = ibv_event_type_str;
	v.fork_init = ibv_fork_init;
}
#else
static void *bind_one(void *lib, const char *name)
{
	void *f = dlvsym(lib, name, "IBVERBS_1.1");
	if (!f)
		die("dlvsym(%s, IBVERBS_1.1): %s", name, dlerror());
	return f;
}

/* As NCCL's IB transport: dlopen, then dlvsym for each verb. */
static void bind_verbs(void)
{
	void *lib = dlopen("libibverbs.so.1", RTLD_NOW);
	if (!lib)
		die("dlopen(libibverbs.so.1): %s", dlerror());
	*(void **)&v.get_device_list = bind_one(lib, "ibv_get_device_list");
	*(void **)&v.get_device_name = bind_one(lib, "ibv_get_device_name");
	*(void **)&v.open_device = bind_one(lib, "ibv_open_device");
	*(void **)&v.alloc_pd = bind_one(lib, "ibv_alloc_pd");
	*(void **)&v.reg_mr = bind_one(lib, "ibv_reg_mr");
	*(void **)&v.create_cq = bind_one(lib, "ibv_create_cq");
	*(void **)&v.create_qp = bind_one(lib, "ibv_create_qp");
	*(void **)&v.modify_qp = bind_one(lib, "ibv_modify_qp");
	*(void **)&v.query_qp = bind_one(lib, "ibv_query_qp");
	*(void **)&v.destroy_qp = bind_one(lib, "ibv_destroy_qp");
	*(void **)&v.query_gid = bind_one(lib, "ibv_query_gid");
	*(void **)&v.get_async_event = bind_one(lib, "ibv_get_async_event");
	*(void **)&v.ack_async_event = bind_one(lib, "ibv_ack_async_event");
	*(void **)&v.event_type_str = bind_one(lib, "ibv_event_type_str");
	*(void **)&v.fork_init = bind_one(lib, "ibv_fork_init");
}
#endif

struct opts {
	const char *dev[2];
	int gidx[2];
	int devs, port, conns, timeout, retry, own_sqd, align, loopback;
	long max;
	const char *stop, *events, *fork_mode;
	const char *destroy; /* -x: destroy every QP when this file exists */
	const char *server_ip; /* set on the client */
	char **argv;
};

/* One device: its context, PD, CQ, buffer and the QPs on it. */
struct dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
	int gidx;
};

struct conn {
	struct dev *d;
	struct ibv_qp *qp;
	int slot;
	uint64_t next;	/* the next number to expect */
	int stop_sent, done, failed, dead;
};

/* What one end tells the other of each connection. */
struct wire {
	uint32_t qpn, psn;
	uint8_t gid[16];
};

static struct dev devs[2];
static struct conn conns[MAX_CONNS];
static int nconns;
static long drained_seen, other_events;
static int sqd_asked;
static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;

static void open_dev(struct dev *d, const char *name, int gidx)
{
	int n;
	struct ibv_device **list = v.get_device_list(&n);
	if (!list)
		die("no device list: %s", strerror(errno));
	for (int i = 0; i < n && !d->ctx; i++)
		if (!strcmp(v.get_device_name(list[i]), name))
			d->ctx = v.open_device(list[i]);
	if (!d->ctx)
		die("cannot open %s", name);
	d->pd = v.alloc_pd(d->ctx);
	d->cq = v.create_cq(d->ctx, 4 * MAX_CONNS, NULL, NULL, 0);
	/* Whole pages of its own: after ibv_fork_init a child does not have the pages of
	 * registered memory, nor anything else that shared them. */
	void *buf = NULL;
	if (!d->pd || !d->cq || posix_memalign(&buf, BUF_BYTES, BUF_BYTES))
		die("cannot set %s up", name);
	d->buf = memset(buf, 0, BUF_BYTES);
	d->mr = v.reg_mr(d->pd, d->buf, BUF_BYTES, IBV_ACCESS_LOCAL_WRITE);
	if (!d->mr || v.query_gid(d->ctx, 1, gidx, &d->gid))
		die("no MR or GID %d on %s", gidx, name);
	d->gidx = gidx;
}

static struct ibv_qp *new_qp(struct dev *d)
{
	struct ibv_qp_init_attr a = {
		.send_cq = d->cq, .recv_cq = d->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = v.create_qp(d->pd, &a);
	if (!qp)
		die("create_qp: %s", strerror(errno));
	return qp;
}

/* -A: QP numbers count up per device; re-create the lower one until they are equal
 * (want_equal) or differ. */
static void align_qpns(struct conn *a, struct conn *b, int want_equal)
{
	for (int i = 0; i < 4096 && (a->qp->qp_num == b->qp->qp_num) != want_equal; i++) {
		struct conn *lo = a->qp->qp_num <= b->qp->qp_num ? a : b;
		struct ibv_qp *old = lo->qp;
		lo->qp = new_qp(lo->d);
		v.destroy_qp(old);
	}
}

static void post_recv(struct conn *c)
{
	struct ibv_sge sge = { (uintptr_t)(c->d->buf + 2 * c->slot * MSG), MSG, c->d->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 2 * c->slot, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(c->qp, &wr, &bad))
		die("post_recv");
}

static void post_send(struct conn *c, uint64_t n)
{
	char *at = c->d->buf + (2 * c->slot + 1) * MSG;
	memcpy(at, &n, sizeof n);
	struct ibv_sge sge = { (uintptr_t)at, MSG, c->d->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 2 * c->slot + 1, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	if (ibv_post_send(c->qp, &wr, &bad))
		die("post_send");
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *what)
{
	if (v.modify_qp(qp, a, mask))
		die("%s: %s", what, strerror(errno));
}

static void connect_qp(struct conn *c, const struct wire *peer, uint32_t my_psn, int timeout,
		       int retry)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE,
	};
	modify(c->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
	       "RESET->INIT");
	post_recv(c);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qpn;
	a.rq_psn = peer->psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.grh.sgid_index = c->d->gidx;
	memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
	modify(c->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
	       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER, "INIT->RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = my_psn;
	a.timeout = timeout;
	a.retry_cnt = retry;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	modify(c->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
	       IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC, "RTR->RTS");
}

static void full(int fd, void *p, size_t n, int writing)
{
	for (size_t done = 0; done < n;) {
		ssize_t k = writing ? write(fd, (char *)p + done, n - done)
				    : read(fd, (char *)p + done, n - done);
		if (k <= 0)
			die("TCP exchange: %s", k ? strerror(errno) : "closed");
		done += k;
	}
}

static int tcp(const struct opts *o)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(o->port) };
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (o->server_ip) {
		inet_pton(AF_INET, o->server_ip, &sa.sin_addr);
		for (int i = 0; connect(s, (struct sockaddr *)&sa, sizeof sa); i++) {
			if (i > 300)
				die("cannot reach the server");
			usleep(100000);
		}
		return s;
	}
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(s, (struct sockaddr *)&sa, sizeof sa) || listen(s, 1))
		die("listen: %s", strerror(errno));
	int c = accept(s, NULL, NULL);
	close(s);
	return c;
}

/* Count and print one event: an SQ_DRAINED before the program asked for a drain of
 * its own is one it should never have seen. */
static void count_event(struct ibv_async_event *e, int reading_late)
{
	pthread_mutex_lock(&ev_lock);
	if (e->event_type == IBV_EVENT_SQ_DRAINED && sqd_asked)
		sqd_asked++;
	else if (e->event_type == IBV_EVENT_SQ_DRAINED)
		drained_seen++;
	else
		other_events++;
	printf("event %s%s\n", v.event_type_str(e->event_type), reading_late ? " (late)" : "");
	pthread_mutex_unlock(&ev_lock);
}

static void *event_thread(void *arg)
{
	struct dev *d = arg;
	struct ibv_async_event e;
	while (!v.get_async_event(d->ctx, &e)) {
		count_event(&e, 0);
		v.ack_async_event(&e);
	}
	return NULL;
}

/* Read what is queued on `d`'s context without blocking. */
static void read_late(struct dev *d)
{
	struct ibv_async_event e;
	int fl = fcntl(d->ctx->async_fd, F_GETFL);
	fcntl(d->ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
	while (!v.get_async_event(d->ctx, &e)) {
		count_event(&e, 1);
		v.ack_async_event(&e);
	}
	if (errno != EAGAIN)
		die("ibv_get_async_event: %s", strerror(errno));
	fcntl(d->ctx->async_fd, F_SETFL, fl);
}

/* -q: the program's own drain of each QP, with en_sqd_async_notify, and its event. */
static void own_sqd(const struct opts *o)
{
	int asked = 0, got = 0;
	pthread_mutex_lock(&ev_lock);
	sqd_asked = 1;
	pthread_mutex_unlock(&ev_lock);
	for (int i = 0; i < nconns; i++) {
		if (conns[i].dead)
			continue;
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_SQD, .en_sqd_async_notify = 1 };
		modify(conns[i].qp, &a, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY, "RTS->SQD");
		asked++;
	}
	for (int t = 0; t < 500 && got < asked; t++) {
		if (!strcmp(o->events, "late"))
			for (int k = 0; k < o->devs; k++)
				read_late(&devs[k]);
		pthread_mutex_lock(&ev_lock);
		got = sqd_asked - 1;
		pthread_mutex_unlock(&ev_lock);
		usleep(10000);
	}
	printf("own-sqd: %d of %d drained; SQ_DRAINED before: %ld\n", got, asked, drained_seen);
}

static int loopback(const struct opts *o);

/* -f: a child of the client, without exec (`noexec`) or with it (`exec`). */
static void fork_child(const struct opts *o, const char *mode)
{
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		if (!strcmp(mode, "exec")) {
			char g0[16], g1[16];
			snprintf(g0, sizeof g0, "%d", o->gidx[0]);
			snprintf(g1, sizeof g1, "%d", o->gidx[1]);
			execl("/proc/self/exe", o->argv[0], "-L", "-d", o->dev[0], "-g", g0,
			      "-D", o->dev[1], "-G", g1, (char *)NULL);
			_exit(127);
		}
		_exit(loopback(o));
	}
	int status;
	waitpid(pid, &status, 0);
	printf("child %d (%s): %s %d\n", (int)pid, mode,
	       WIFEXITED(status) ? "exit" : "signal",
	       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

/* Handle one completion; returns 1 when a round trip ended (client). */
static int completion(const struct opts *o, struct ibv_wc *wc)
{
	struct conn *c = &conns[wc->wr_id / 2];
	int is_recv = wc->wr_id % 2 == 0, client = o->server_ip != NULL;
	if (c->dead)
		return 0;
	if (wc->status != IBV_WC_SUCCESS || c->failed) {
		if (!o->destroy)
			die("qp %u: completion status %d", c->qp->qp_num, wc->status);
		if (!c->failed)
			printf("failed qp %u: completion status %d\n", c->qp->qp_num, wc->status);
		c->failed = 1;
		return 0;
	}
	if (!is_recv) {
		/* The server is done with a connection once its stop mark went through. */
		c->done |= c->stop_sent && !client;
		return 0;
	}
	uint64_t n;
	memcpy(&n, c->d->buf + 2 * c->slot * MSG, sizeof n);
	post_recv(c);
	if (n == STOP) {
		c->done |= client;
		if (!client) {
			post_send(c, STOP);
			c->stop_sent = 1;
		}
		return 0;
	}
	if (n != c->next)
		die("qp %u: got message %llu, expected %llu", c->qp->qp_num,
		    (unsigned long long)n, (unsigned long long)c->next);
	c->next++;
	if (!client)
		post_send(c, n); /* the echo */
	return client;
}

/* Whether the other end closed the TCP connection (it has ended). */
static int peer_gone(int sock)
{
	struct pollfd p = { .fd = sock, .events = POLLIN };
	char c;
	return poll(&p, 1, 0) == 1 && recv(sock, &c, 1, MSG_DONTWAIT) == 0;
}

/* -x: destroy every QP left, saying what each ibv_destroy_qp returned. */
static void destroy_all(const char *why, int *bad_destroys)
{
	for (int i = 0; i < nconns; i++) {
		struct conn *c = &conns[i];
		if (c->dead || c->done)
			continue;
		uint32_t qpn = c->qp->qp_num;
		int rc = v.destroy_qp(c->qp);
		printf("destroy qp %u rc=%d errno=%d (%s%s)\n", qpn, rc, rc ? errno : 0,
		       c->failed ? "failed, " : "", why);
		*bad_destroys += rc != 0;
		c->dead = 1;
	}
}

/* The other end is gone. A stop mark sent is one it had (it ends only once it has
 * them all); with -x, what is left is destroyed. */
static void peer_ended(const struct opts *o, int *bad_destroys)
{
	for (int i = 0; i < nconns; i++) {
		conns[i].done |= conns[i].stop_sent;
		if (!conns[i].done && !conns[i].dead && !o->destroy)
			die("the other end is gone");
	}
	destroy_all("the other end ended", bad_destroys);
}

static int run(const struct opts *o, int sock)
{
	int bad_destroys = 0, stopping = 0;
	long trips = 0, spins = 0;
	if (o->server_ip)
		for (int i = 0; i < nconns; i++)
			post_send(&conns[i], conns[i].next);
	for (;;) {
		int live = 0;
		for (int i = 0; i < nconns; i++)
			live += !conns[i].done && !conns[i].dead;
		if (!live)
			break;
		if (++spins % 4096 == 0 && o->destroy && !access(o->destroy, F_OK)) {
			destroy_all("told to", &bad_destroys);
			continue;
		}
		if (spins % 4096 == 0 && peer_gone(sock)) {
			peer_ended(o, &bad_destroys);
			continue;
		}
		for (int k = 0; k < o->devs; k++) {
			struct ibv_wc wc[8];
			int n = ibv_poll_cq(devs[k].cq, 8, wc);
			if (n < 0)
				die("poll_cq");
			for (int j = 0; j < n; j++) {
				if (!completion(o, &wc[j]))
					continue;
				/* A round trip ended on the client: the next number, or stop. */
				struct conn *c = &conns[wc[j].wr_id / 2];
				if (++trips % 100 == 0) {
					printf("progress %ld\n", trips);
					fflush(stdout);
					if (o->fork_mode && (trips == 100 || trips == 200))
						fork_child(o, strcmp(o->fork_mode, "both") ? o->fork_mode
							   : trips == 100 ? "noexec" : "exec");
				}
				if (!stopping && ((o->max && trips >= o->max * nconns) ||
						  (o->stop && trips % 16 == 0 &&
						   !access(o->stop, F_OK))))
					stopping = 1;
				post_send(c, stopping ? STOP : c->next);
			}
		}
	}
	if (o->events && !strcmp(o->events, "late"))
		for (int k = 0; k < o->devs; k++)
			read_late(&devs[k]);
	if (o->own_sqd)
		own_sqd(o);
	for (int i = 0; i < nconns; i++)
		if (!conns[i].dead && v.destroy_qp(conns[i].qp))
			die("destroy_qp: %s", strerror(errno));
	printf("done: %ld round trips, every message once and in order%s\n", trips,
	       bad_destroys ? "; a destroy failed" : "");
	return bad_destroys ? 1 : 0;
}

/* -L: one pair between the two devices, within this process, 100 round trips. */
static int loopback(const struct opts *o)
{
	struct dev d[2] = { 0 };
	open_dev(&d[0], o->dev[0], o->gidx[0]);
	open_dev(&d[1], o->dev[1], o->gidx[1]);
	struct conn c[2] = { { .d = &d[0], .slot = 0 }, { .d = &d[1], .slot = 0 } };
	c[0].qp = new_qp(&d[0]);
	c[1].qp = new_qp(&d[1]);
	/* Distinct numbers: the agent routes by the pair of them. */
	align_qpns(&c[0], &c[1], 0);
	for (int i = 0; i < 2; i++) {
		struct wire w = { c[1 - i].qp->qp_num, 0x100 * (2 - i), { 0 } };
		memcpy(w.gid, d[1 - i].gid.raw, 16);
		connect_qp(&c[i], &w, 0x100 * (i + 1), 14, 7);
	}
	for (uint64_t n = 0; n < 100; n++) {
		post_send(&c[0], n);
		for (int got = 0; !got;) {
			struct ibv_wc wc;
			int k = ibv_poll_cq(d[1].cq, 1, &wc);
			if (k < 0 || (k == 1 && wc.status != IBV_WC_SUCCESS))
				return 1;
			if (k == 1 && wc.wr_id == 0) {
				post_recv(&c[1]);
				got = 1;
			}
		}
		while (ibv_poll_cq(d[0].cq, 1, &(struct ibv_wc){ 0 }) == 0)
			;
	}
	printf("child: loopback qps %u and %u, 100 messages\n", c[0].qp->qp_num,
	       c[1].qp->qp_num);
	fflush(stdout);
	v.destroy_qp(c[0].qp);
	v.destroy_qp(c[1].qp);
	return 0;
}

static void usage(void)
{
	die("usage: rc_dlopen -d DEV -g GIDX [-D DEV2 -G GIDX2] [-p PORT] [-c CONNS] [-n MAX] "
	    "[-S STOPFILE] [-t TIMEOUT] [-r RETRY] [-e early|late] [-q] [-x DESTROYFILE] [-A] "
	    "[-f noexec|exec|both] [-L] "
	    "[-R] [SERVER_IP]");
}

static void parse(int argc, char **argv, struct opts *o)
{
	int ch;
	*o = (struct opts){ .port = 18700, .conns = 1, .timeout = 14, .retry = 7, .devs = 1,
			    .argv = argv };
	while ((ch = getopt(argc, argv, "d:g:D:G:p:c:n:S:t:r:e:qx:Af:LR")) != -1) {
		switch (ch) {
		case 'd': o->dev[0] = optarg; break;
		case 'g': o->gidx[0] = atoi(optarg); break;
		case 'D': o->dev[1] = optarg; o->devs = 2; break;
		case 'G': o->gidx[1] = atoi(optarg); break;
		case 'p': o->port = atoi(optarg); break;
		case 'c': o->conns = atoi(optarg); break;
		case 'n': o->max = atol(optarg); break;
		case 'S': o->stop = optarg; break;
		case 't': o->timeout = atoi(optarg); break;
		case 'e': o->events = optarg; break;
		case 'q': o->own_sqd = 1; break;
		case 'x': o->destroy = optarg; break;
		case 'r': o->retry = atoi(optarg); break;
		case 'A': o->align = 1; break;
		case 'f': o->fork_mode = optarg; break;
		case 'L': o->loopback = 1; break;
		case 'R': o->loopback = -1; break;
		default: usage();
		}
	}
	if (optind < argc)
		o->server_ip = argv[optind];
	if (o->conns < 1 || o->conns > MAX_CONNS || (o->loopback >= 0 && !o->dev[0]))
		usage();
	if (o->own_sqd && !o->events)
		o->events = "late";
}

/* A crash says where (the test shows these lines when a process fails). */
static void crashed(int sig)
{
	void *frames[32];
	int n = backtrace(frames, 32);
	char line[64];
	int len = snprintf(line, sizeof line, "rc_dlopen: crash: signal %d in pid %d\n", sig,
			   (int)getpid());
	if (write(2, line, len) < 0 || n <= 0)
		_exit(128 + sig);
	backtrace_symbols_fd(frames, n, 2);
	_exit(128 + sig);
}

int main(int argc, char **argv)
{
	struct opts o;
	signal(SIGSEGV, crashed);
	signal(SIGBUS, crashed);
	parse(argc, argv, &o);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (o.loopback < 0) {
		/* A program apm cannot see: it holds a device and uses no verb of apm's. */
		int fd = open("/dev/infiniband/uverbs0", O_RDWR | O_CLOEXEC);
		printf("holding /dev/infiniband/uverbs0: %s\n", fd < 0 ? strerror(errno) : "yes");
		return fd < 0;
	}
	bind_verbs();
	if (v.fork_init())
		die("ibv_fork_init failed");
	if (o.loopback)
		return loopback(&o);
	for (int k = 0; k < o.devs; k++)
		open_dev(&devs[k], o.dev[k], o.gidx[k]);
	nconns = o.conns;
	for (int i = 0; i < nconns; i++) {
		conns[i] = (struct conn){ .d = &devs[i % o.devs], .slot = i };
		conns[i].qp = new_qp(conns[i].d);
	}
	if (o.align && o.devs == 2 && nconns >= 2)
		align_qpns(&conns[0], &conns[1], o.server_ip != NULL);
	int s = tcp(&o);
	struct wire mine[MAX_CONNS], theirs[MAX_CONNS];
	for (int i = 0; i < nconns; i++) {
		mine[i] = (struct wire){ conns[i].qp->qp_num, (o.server_ip ? 0x1000 : 0x2000) + i, { 0 } };
		memcpy(mine[i].gid, conns[i].d->gid.raw, 16);
		printf("qp %u on %s\n", conns[i].qp->qp_num,
		       v.get_device_name(conns[i].d->ctx->device));
	}
	full(s, mine, nconns * sizeof mine[0], 1);
	full(s, theirs, nconns * sizeof theirs[0], 0);
	for (int i = 0; i < nconns; i++)
		connect_qp(&conns[i], &theirs[i], mine[i].psn, o.timeout, o.retry);
	/* Both ends in RTS before the first message. */
	char go = 1;
	full(s, &go, 1, 1);
	full(s, &go, 1, 0);
	pthread_t t[2];
	if (o.events && !strcmp(o.events, "early"))
		for (int k = 0; k < o.devs; k++)
			pthread_create(&t[k], NULL, event_thread, &devs[k]);
	int rc = run(&o, s);
	close(s);
	fflush(stdout);
	/* The event threads stay blocked in ibv_get_async_event: exit ends them. */
	return rc;
}
