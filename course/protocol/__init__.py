"""The single-step training protocol of lesson 16 (no exercises here), below the reference and the trainers.

* ``types``  - the API types of the protocol; the student's ``impl/train_session.py`` and the
               reference import them from here.
* ``text``   - text micro-batches that carry their valid-token count, and the step functions
               (token-weighted, and lesson 14's naive mean for comparison).
* ``driver`` - the run driver: data order, global batches, ``normalization_units``, update
               counters, lr schedule, loss readback. It runs any implementation passed to it (``impl``).
"""
