-- Small blobs (up to 16 KiB) are stored in their metadata row: one commit makes them durable.
ALTER TABLE blobs ADD COLUMN inline_data BLOB;
