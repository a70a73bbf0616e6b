"""The ranks' exchange of a step's managed-collision keys: each key goes to the rank holding
its remapper part, and its slot comes back, by two all-to-alls.

A step, 2 ranks, features ``u`` (parts on ranks 0, 1) and ``v``; each rank sends, per
destination rank, its keys grouped by feature in their own order::

    rank 0 keys  u: a b c   v: d        dest  u: 0 1 0   v: 1
    rank 1 keys  u: e       v: f g      dest  u: 1       v: 0 1

    counts (dest x feature, + the data time's bits)  --all_to_all-->  who sends me what
    rank 0 sends  to 0: u a c         to 1: u b  v d
    rank 1 sends  to 0: v f           to 1: u e  v g
    rank 0 gets   u: a c  v: f        (per feature, senders in rank order)
    rank 1 gets   u: b e  v: d g

Each part thus sees the subsequence of its keys that gathering every rank's keys in rank
order would give it (the remapper's decisions are those of the all-gather exchange), and the
slots return by the reverse all-to-all, so a rank receives its own keys' slots only.

Example:
    >>> routed = RoutedKeys.exchange([u_keys, v_keys], [u_dest, v_dest], now, group)
    >>> slots = routed.reply([remap_u(routed.keys[0]), remap_v(routed.keys[1])])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch


@dataclasses.dataclass
class RoutedKeys:
    """The keys this rank's remapper parts own, received from every rank, and the way back.

    Attributes:
        keys: per feature, the keys received (every sender's in rank order, each in its own
            order).
        now: the step's data time: the latest of the ranks' (None where no rank has one).
    """

    keys: list[torch.Tensor]
    now: float | None
    group: Any
    lengths: list[int]  # this rank's keys per feature
    order: torch.Tensor  # (N,) this rank's keys (features concatenated) in sending order
    positions: list[torch.Tensor]  # per feature, where its keys sit among those received
    send_splits: list[int]  # keys sent to each rank
    recv_splits: list[int]  # keys received from each rank

    @classmethod
    def exchange(cls, keys: Sequence[torch.Tensor], dests: Sequence[torch.Tensor],
                 now: float | None, group: Any) -> RoutedKeys:
        """Send each of ``keys[f]`` (1-D int64, per feature) to the rank ``dests[f]`` names
        (every rank calls this together, with the same features). ``now``: this rank's
        data time of the step, or None."""
        import torch.distributed as dist

        world = dist.get_world_size(group)
        device = keys[0].device
        features = len(keys)
        lengths = [k.numel() for k in keys]
        feature = torch.repeat_interleave(
            torch.arange(features, device=device), torch.tensor(lengths, device=device))
        bucket = torch.cat(list(dests)).to(device) * features + feature  # (N,)
        order = torch.argsort(bucket, stable=True)  # by destination, then feature
        counts = torch.bincount(bucket, minlength=world * features).view(world, features)
        # The rank's data time rides with the counts, as the bits of a float64.
        stamp = torch.tensor([-math.inf if now is None else now], dtype=torch.float64)
        meta = torch.cat([counts, stamp.view(torch.int64).to(device).expand(world, 1)], 1)
        got = torch.empty_like(meta)  # (W, F + 1): what each rank sends here
        dist.all_to_all_single(got, meta.contiguous(), group=group)
        got = got.cpu()
        latest = float(got[:, -1].contiguous().view(torch.float64).max())
        got_counts = got[:, :-1]  # (W, F)
        send_splits = counts.sum(1).tolist()
        recv_splits = got_counts.sum(1).tolist()
        received = torch.empty(sum(recv_splits), dtype=torch.int64, device=device)
        dist.all_to_all_single(received, torch.cat(list(keys)).to(torch.int64)[order],
                               recv_splits, send_splits, group=group)
        # The feature of each key received: senders in rank order, each feature by feature.
        received_feature = torch.repeat_interleave(
            torch.arange(features).repeat(world), got_counts.reshape(-1)).to(device)
        positions = [(received_feature == f).nonzero().squeeze(1) for f in range(features)]
        return cls(keys=[received[p] for p in positions],
                   now=None if latest == -math.inf else latest, group=group, lengths=lengths,
                   order=order, positions=positions, send_splits=send_splits,
                   recv_splits=recv_splits)

    def reply(self, slots: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Send back ``slots[f]`` (one per key of :attr:`keys` ``[f]``) to the keys' ranks;
        returns, per feature, the slots of this rank's own keys in their order."""
        import torch.distributed as dist

        device = self.order.device
        answer = torch.empty(sum(self.recv_splits), dtype=torch.int64, device=device)
        for where, part in zip(self.positions, slots, strict=True):
            answer[where] = part.to(device, torch.int64)
        back = torch.empty(self.order.numel(), dtype=torch.int64, device=device)
        dist.all_to_all_single(back, answer, self.send_splits, self.recv_splits,
                               group=self.group)
        out = torch.empty_like(back)
        out[self.order] = back  # sending order -> this rank's own order
        return list(out.split(self.lengths))
