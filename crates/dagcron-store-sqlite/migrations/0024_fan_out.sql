-- Dynamic fan-out (dagcron_core::fan_out): the instances of a mapped task
-- are tasks of the run of their own, after the run's declared tasks, each
-- with its item (JSON); a mapped task keeps why it has no instances or
-- failed by them. Its instances' outputs, gathered, go in `outputs`, as a
-- carried task's do.
ALTER TABLE tasks ADD COLUMN item TEXT;
ALTER TABLE tasks ADD COLUMN note TEXT;
