/* door_peer_lane.h -- what door_peer_lane.c (the peer read-ahead lane's thread, its requests in
 * flight, its exports: front_door.h's front_door_peer_*) gives the door's other parts: the lane
 * stopped and freed, and the readers' own progress requests answered. Its state is
 * door_peer_ahead.h's. Part of front_door.c's one translation unit. */
#ifndef MONARCH_DOOR_PEER_LANE_H
#define MONARCH_DOOR_PEER_LANE_H

#define PROGRESS_FRAMES_MAX 64         /* HINT PROGRESS requests read at once (monarch.hints: UNANSWERED_MAX) */

struct door;
/* -- what the other parts call ---------------------------------------------------------- */
static void stop_peer_ahead(struct door *d);  /* its thread joined; harmless twice */
static void free_peer_ahead(struct door *d);
/* HINT PROGRESS requests of the lane's stream answered here (1: the connection is the door's), else 0 */
static int peer_progress_frames(struct door *d, int fd, const char *buf, uint32_t got);

#endif /* MONARCH_DOOR_PEER_LANE_H */
