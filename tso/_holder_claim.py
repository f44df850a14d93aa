"""The proof that a leader is gone: the store's exclusive claim of its role (rule S7).

On stores whose claims are exclusive OS locks (SQLite: a lock on the database file
itself), a leader holds the claim of its role for its whole term and marks its row
``claimed``; it lets go only after its term ended (it serves nothing more), or when its
process dies. A follower that then gets the claim knows the holder of a ``claimed`` row
has stopped serving and may take over at once instead of waiting out the lease. See
:mod:`tso._lease` for the protocol this serves.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from storage_adapters import Claim, KVStore, StoreClaimedError, StoreError

if TYPE_CHECKING:
    from tso._lease import LeaseRecord

log = logging.getLogger(__name__)


class HolderClaim:
    """One replica's hold on the store's exclusive claim of a role.

    ``claim``: held by this process for as long as it lives (an embedded oracle).
    ``claim_role``: instead, claimed on the store for each term (replicas), from before
    the row is written ``claimed`` until the term under it has ended. On stores whose
    claims are not exclusive neither proves anything, and :meth:`now` is ``None``.
    """

    def __init__(self, store: KVStore, *, claim: Claim | None, claim_role: str | None) -> None:
        self._store = store
        self._life_claim = claim
        self._claim_role = claim_role
        #: The claim taken for a takeover (``claim_role``): held from before the row is
        #: written ``claimed`` until this replica's term under it has ended.
        self._term_claim: Claim | None = None

    def proves_gone(self, record: LeaseRecord) -> bool:
        """The holder held the store's exclusive claim while it could serve under
        ``record``, and now we hold it: it has stopped serving (an oracle checks its
        claim or its lease at every hand-out), or it died."""
        return record.claimed and self.now() is not None

    def now(self) -> Claim | None:
        """The store's exclusive claim of the role, if this replica holds it or can take
        it now without waiting; ``None`` when another holds it or none is exclusive."""
        for claim in (self._life_claim, self._term_claim):
            if claim is not None and claim.exclusive and claim.held:
                return claim
        if self._claim_role is None or self._life_claim is not None:
            return None
        try:
            claim = self._store.claim(self._claim_role)
        except StoreClaimedError:
            return None
        except StoreError as exc:
            log.debug("cannot claim %s: %s", self._claim_role, exc)
            return None
        if not claim.exclusive:  # a store that cannot tell: the claim proves nothing
            claim.release()
            return None
        self._term_claim = claim
        return claim

    def drop_term_claim(self) -> None:
        """Let go of the claim taken for a term (never the life claim): the term ended,
        or a takeover was lost or not yet due."""
        claim, self._term_claim = self._term_claim, None
        if claim is not None:
            claim.release()
