-- One segmentation request per conversation while one is pending. Every append used to publish a
-- SegmentationRequested; under load the queue held one message per turn (23,000 for 1,179
-- conversations in the conversations benchmark), and each redundant one read the conversation's
-- open tail again. An append now publishes only when no request is pending (or the pending one
-- is older than a minute: a lost or dead-lettered message must not silence a conversation), and
-- the segmentation consumer clears the mark before it reads the tail, so a turn committed after
-- the clear asks again.
ALTER TABLE conversations ADD COLUMN segmentation_requested_at timestamptz NULL;
