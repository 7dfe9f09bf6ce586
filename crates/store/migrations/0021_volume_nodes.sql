-- The node whose disk holds a volume's data (`[node] id` of the daemon that made it): in a
-- cluster its sessions run, and its files are served, there. NULL for volumes made before
-- this column: served by whichever node is asked, as before.
ALTER TABLE volumes ADD COLUMN node_id TEXT;
