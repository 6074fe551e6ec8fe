-- kernelgate's records: one row per record, the record as JSON, kept as written (the same
-- encoding as the embedded file's).
CREATE TABLE kernels (
	id   text PRIMARY KEY,
	data json NOT NULL
);
CREATE TABLE contexts (
	id   text PRIMARY KEY,
	data json NOT NULL
);
CREATE TABLE sessions (
	id   text PRIMARY KEY,
	data json NOT NULL
);
CREATE TABLE sandboxes (
	id   text PRIMARY KEY,
	data json NOT NULL
);
-- Run records and their events, as their owner encoded them.
CREATE TABLE runs (
	id   text PRIMARY KEY,
	data bytea NOT NULL
);
CREATE TABLE run_events (
	run_id text   NOT NULL,
	seq    bigint NOT NULL,
	data   bytea  NOT NULL,
	PRIMARY KEY (run_id, seq)
);
