/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Socket-level load balancing for the node's own processes (kubelet probes,
 * host-network pods): cgroup hooks translate a service frontend to a backend
 * where the socket names its peer, at connect() and at each sendmsg() of an
 * unconnected UDP socket, so the packets leave the socket already addressed
 * to the backend and no packet is ever rewritten. getpeername() and
 * recvmsg() give the socket the frontend back, from cel_lb{4,6}_reverse_sk
 * (socket cookie + backend -> frontend), so the process never sees the
 * translation.
 *
 * Only sockets of the node's own network namespace are translated (its
 * cookie is cel_config.host_netns_cookie; 0 translates nothing): a pod's
 * connections are balanced per packet on its veth, as before, and the
 * hooks of another node's agent on the same machine never touch this
 * node's sockets.
 */
#ifndef CELLIUM_LIB_SOCK_H
#define CELLIUM_LIB_SOCK_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "lb.h"
#include "lookup.h"
#include "maps.h"

#define CEL_ECONNREFUSED 111

/* Whether the hooks translate this socket. */
static __always_inline int sock_in_node(struct bpf_sock_addr *ctx,
					const struct datapath_config *cfg)
{
	return cfg && cfg->host_netns_cookie &&
	       bpf_get_netns_cookie(ctx) == cfg->host_netns_cookie;
}

/*
 * The backend slot a socket takes among `count`. connect() draws at random,
 * as the per-packet path does for a new connection. An unconnected UDP
 * socket asks at every sendmsg(): it takes the slot its cookie names, so
 * its datagrams keep going to one backend while the backends stay the same.
 */
static __always_inline __u16 sock_slot(struct bpf_sock_addr *ctx, __u16 count, int per_message)
{
	__u64 pick = per_message ? bpf_get_socket_cookie(ctx) : bpf_get_prandom_u32();

	return (__u16)(pick % count) + 1;
}

/*
 * No backend: with service-no-backend-response reject the call fails with
 * ECONNREFUSED, as the per-packet path refuses a pod's connection; with
 * drop the address is left as it is. Returns the hook's verdict.
 */
static __always_inline int sock_no_backend(const struct datapath_config *cfg)
{
	if (!(cfg->flags & CEL_CFG_F_SERVICE_REJECT))
		return 1;
	bpf_set_retval(-CEL_ECONNREFUSED);
	return 0;
}

/*
 * Session affinity (slot 0's timeout, 0 = none) for the node's sockets.
 * Every socket the hooks translate is of the node's network namespace, so
 * the node is one client, as Cilium keys the host's affinity by its network
 * namespace: its entries use the unspecified address, which no packet's
 * source ever is. A new socket takes the backend the node's last one took
 * while within the timeout and still the frontend's, else `drawn`; either
 * renews the entry, as a pod's new connection does (lb4_commit).
 */
static __always_inline __u32 sock4_affine(__u16 rev_nat_id, __u32 timeout, __u32 drawn)
{
	struct lb4_affinity_key akey = { .rev_nat_id = rev_nat_id };
	struct lb_affinity_val av = {};
	__u64 now = bpf_ktime_get_ns();
	__u32 id;

	if (!timeout)
		return drawn;
	id = lb_affinity_live(bpf_map_lookup_elem(&cel_lb4_affinity, &akey), timeout,
			      rev_nat_id, now);
	av.backend_id = id ? id : drawn;
	av.last_used_ns = now;
	bpf_map_update_elem(&cel_lb4_affinity, &akey, &av, BPF_ANY);
	return av.backend_id;
}

static __always_inline __u32 sock6_affine(__u16 rev_nat_id, __u32 timeout, __u32 drawn)
{
	struct lb6_affinity_key akey = { .rev_nat_id = rev_nat_id };
	struct lb_affinity_val av = {};
	__u64 now = bpf_ktime_get_ns();
	__u32 id;

	if (!timeout)
		return drawn;
	id = lb_affinity_live(bpf_map_lookup_elem(&cel_lb6_affinity, &akey), timeout,
			      rev_nat_id, now);
	av.backend_id = id ? id : drawn;
	av.last_used_ns = now;
	bpf_map_update_elem(&cel_lb6_affinity, &akey, &av, BPF_ANY);
	return av.backend_id;
}

/* connect4 / sendmsg4: the frontend the socket names, translated. Returns
 * the hook's verdict (1: go on, 0: refuse). */
static __always_inline int sock4_translate(struct bpf_sock_addr *ctx, int per_message)
{
	struct datapath_config *cfg = config_get();
	struct sock_rev4_key rkey = {};
	struct sock_rev4_value rval = {};
	struct lb4_key key = {};
	struct lb4_service *svc, *slot;
	struct lb4_backend *be;
	__u32 id;

	if (!sock_in_node(ctx, cfg))
		return 1;
	if (ctx->protocol != CEL_PROTO_TCP && ctx->protocol != CEL_PROTO_UDP)
		return 1;
	key.vip = ctx->user_ip4;
	key.dport = (__be16)ctx->user_port;
	key.protocol = ctx->protocol;
	svc = bpf_map_lookup_elem(&cel_lb4_services, &key);
	/* A frontend with loadBalancerSourceRanges is left to the packet path
	 * (lb4_dnat), which checks the client's address: at connect() the
	 * socket's source is not chosen yet. */
	if (!svc || (svc->flags & CEL_SVC_F_SOURCE_RANGE))
		return 1;
	if (svc->count == 0)
		return sock_no_backend(cfg);
	rval.vip = key.vip;
	rval.port = key.dport;
	rval.rev_nat_id = svc->rev_nat_id;
	key.slot = sock_slot(ctx, svc->count, per_message);
	slot = bpf_map_lookup_elem(&cel_lb4_services, &key);
	if (!slot)
		return sock_no_backend(cfg);
	id = sock4_affine(svc->rev_nat_id, svc->backend_id, slot->backend_id);
	be = bpf_map_lookup_elem(&cel_lb4_backends, &id);
	if (!be)
		return sock_no_backend(cfg);

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = be->addr;
	rkey.port = be->port;
	bpf_map_update_elem(&cel_lb4_reverse_sk, &rkey, &rval, BPF_ANY);
	ctx->user_ip4 = be->addr;
	ctx->user_port = be->port;
	return 1;
}

/* getpeername4 / recvmsg4: a backend this socket was translated to becomes
 * its frontend again. */
static __always_inline int sock4_reverse(struct bpf_sock_addr *ctx)
{
	struct sock_rev4_key rkey = {};
	struct sock_rev4_value *rval;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = ctx->user_ip4;
	rkey.port = (__be16)ctx->user_port;
	rval = bpf_map_lookup_elem(&cel_lb4_reverse_sk, &rkey);
	if (!rval)
		return 1;
	ctx->user_ip4 = rval->vip;
	ctx->user_port = rval->port;
	return 1;
}

static __always_inline void sock6_addr(const struct bpf_sock_addr *ctx, __u8 *out)
{
	__u32 w[4];

	w[0] = ctx->user_ip6[0];
	w[1] = ctx->user_ip6[1];
	w[2] = ctx->user_ip6[2];
	w[3] = ctx->user_ip6[3];
	__builtin_memcpy(out, w, 16);
}

static __always_inline void sock6_set_addr(struct bpf_sock_addr *ctx, const __u8 *in)
{
	__u32 w[4];

	__builtin_memcpy(w, in, 16);
	ctx->user_ip6[0] = w[0];
	ctx->user_ip6[1] = w[1];
	ctx->user_ip6[2] = w[2];
	ctx->user_ip6[3] = w[3];
}

/* sock4_translate for IPv6 sockets (IPv4-mapped peers are not translated). */
static __always_inline int sock6_translate(struct bpf_sock_addr *ctx, int per_message)
{
	struct datapath_config *cfg = config_get();
	struct sock_rev6_key rkey = {};
	struct sock_rev6_value rval = {};
	struct lb6_key key = {};
	struct lb4_service *svc, *slot;
	struct lb6_backend *be;
	__u32 id;

	if (!sock_in_node(ctx, cfg))
		return 1;
	if (ctx->protocol != CEL_PROTO_TCP && ctx->protocol != CEL_PROTO_UDP)
		return 1;
	sock6_addr(ctx, key.vip);
	key.dport = (__be16)ctx->user_port;
	key.protocol = ctx->protocol;
	svc = bpf_map_lookup_elem(&cel_lb6_services, &key);
	/* As sock4_translate: left to the packet path. */
	if (!svc || (svc->flags & CEL_SVC_F_SOURCE_RANGE))
		return 1;
	if (svc->count == 0)
		return sock_no_backend(cfg);
	__builtin_memcpy(rval.vip, key.vip, 16);
	rval.port = key.dport;
	rval.rev_nat_id = svc->rev_nat_id;
	key.slot = sock_slot(ctx, svc->count, per_message);
	slot = bpf_map_lookup_elem(&cel_lb6_services, &key);
	if (!slot)
		return sock_no_backend(cfg);
	id = sock6_affine(svc->rev_nat_id, svc->backend_id, slot->backend_id);
	be = bpf_map_lookup_elem(&cel_lb6_backends, &id);
	if (!be)
		return sock_no_backend(cfg);

	rkey.cookie = bpf_get_socket_cookie(ctx);
	__builtin_memcpy(rkey.addr, be->addr, 16);
	rkey.port = be->port;
	bpf_map_update_elem(&cel_lb6_reverse_sk, &rkey, &rval, BPF_ANY);
	sock6_set_addr(ctx, be->addr);
	ctx->user_port = be->port;
	return 1;
}

static __always_inline int sock6_reverse(struct bpf_sock_addr *ctx)
{
	struct sock_rev6_key rkey = {};
	struct sock_rev6_value *rval;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	sock6_addr(ctx, rkey.addr);
	rkey.port = (__be16)ctx->user_port;
	rval = bpf_map_lookup_elem(&cel_lb6_reverse_sk, &rkey);
	if (!rval)
		return 1;
	sock6_set_addr(ctx, rval->vip);
	ctx->user_port = rval->port;
	return 1;
}

#endif /* CELLIUM_LIB_SOCK_H */
