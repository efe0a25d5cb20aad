-- For an agent's join token: the labels the agent may claim (JSON), none: any.
ALTER TABLE tokens ADD COLUMN labels TEXT;
