/* empty_plugin.c: a libpmap-cuda.so that loads but has no entry point, for
 * tests/plugin/test_plugin.sh. */
int pmap_plugin_test_nothing(void);
int pmap_plugin_test_nothing(void) { return 0; }
