-- When a fire's run was found not to have succeeded by the job's SLA.
ALTER TABLE fires ADD COLUMN sla_missed_at INTEGER;
