-- Replicas that are stopping are not handed kernels (docs/replicas.md, "Handover on SIGTERM").
--
-- replicas.leaving: the replica has begun handing its kernels over as it stops. It is no longer a
-- peer a lease can be transferred to, and it adopts no lease handed to it.
ALTER TABLE replicas ADD COLUMN leaving boolean NOT NULL DEFAULT false;
-- leases.handed: the lease was transferred to its owner, which has not adopted it yet. Such a lease
-- is adopted by its owner only while that owner is not leaving (AdoptLease), never acquired by it
-- again in passing, and may be passed on to another replica (PassLease) by anyone: its owner never
-- acted under it.
ALTER TABLE leases ADD COLUMN handed boolean NOT NULL DEFAULT false;
