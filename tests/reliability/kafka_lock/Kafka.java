// The log-dir lock of a Kafka broker, taken exactly as Kafka takes it (kafka.utils.FileLock: a
// RandomAccessFile "rw" on <log.dir>/.lock, then FileChannel.tryLock(), an exclusive fcntl(F_SETLK)
// record lock held for the broker's life). Compiled by the test and run as `java -cp DIR kafka.Kafka MODE DIR`,
// the command line shape of a real broker (its main class is kafka.Kafka).
//   hold DIR  - take the lock (create .lock if missing), print "locked", hold it until killed
//   try DIR   - try once, print "locked" or "refused" (what a starting broker would find), exit
package kafka;

import java.io.File;
import java.io.RandomAccessFile;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;

public class Kafka {
    public static void main(String[] args) throws Exception {
        File file = new File(args[1], ".lock");
        FileChannel channel = new RandomAccessFile(file, "rw").getChannel();
        FileLock lock = channel.tryLock();
        System.out.println(lock == null ? "refused" : "locked");
        System.out.flush();
        if (lock != null && args[0].equals("hold")) {
            Thread.sleep(Long.MAX_VALUE);
        }
    }
}
