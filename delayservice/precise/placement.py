"""Which precise-topic partitions this instance reads, and in which role.

Placement is static, from settings, not from a consumer group: a record's copy lives on
the disk of the instance that read it, so a partition moving to another instance in a
rebalance would strand what the first one holds. Partition p is owned by member
p % members; with two replicas member (p + 1) % members holds a second copy.
"""

from __future__ import annotations

from enum import Enum


class Role(Enum):
    OWNER = "owner"
    """Forwards the partition's records at their due time and reports its progress."""
    REPLICA = "replica"
    """Holds a copy; forwards only what the owner has not reported done after the
    takeover delay."""


class Placement:
    def __init__(self, members: int, member: int, replicas: int) -> None:
        if not 0 <= member < members:
            raise ValueError(f"member {member} is not in [0, {members})")
        if replicas == 2 and members < 2:
            raise ValueError("two replicas need at least two members")
        self.members = members
        self.member = member
        self.replicas = replicas

    def role(self, partition: int) -> Role | None:
        if partition % self.members == self.member:
            return Role.OWNER
        if self.replicas == 2 and (partition + 1) % self.members == self.member:
            return Role.REPLICA
        return None

    def holder(self, partition: int, member: int) -> Role | None:
        """The role `member` has for `partition`, if any."""
        return Placement(self.members, member, self.replicas).role(partition)

    def mine(self, partitions: int) -> dict[int, Role]:
        """This member's partitions of a topic with `partitions` partitions."""
        roles = {p: self.role(p) for p in range(partitions)}
        return {p: role for p, role in roles.items() if role is not None}
